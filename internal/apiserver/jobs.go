package apiserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"riverqueue.com/riverui"

	"github.com/outboxkit/orders/internal/ops"
)

// newRiverUI returns River UI for the ops page (served under ops.JobsPath),
// showing the River queues and jobs the relays work in this database.
//
// The api works no jobs, so its River client is insert-only: no Queues, no
// Workers, never started. River UI reads and acts (cancel, retry, delete
// jobs; pause, resume queues) through the client's Tx methods, which need
// no running client. River UI's handler itself must be started: it
// refreshes its job counts in the background. It runs until ctx is done or
// stop is called, whichever comes first; call stop before the pool closes.
func newRiverUI(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (h http.Handler, stop func(), err error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger: logger.With(slog.String("component", "river")),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating river client for river ui: %w", err)
	}
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logger.With(slog.String("component", "river_ui")),
		Prefix:    ops.JobsPath,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating river ui: %w", err)
	}
	// Its background work ends with this context; River UI has no Stop of
	// its own.
	uiCtx, cancel := context.WithCancel(ctx)
	if err := ui.Start(uiCtx); err != nil {
		cancel()
		return nil, nil, fmt.Errorf("starting river ui: %w", err)
	}
	return ui, cancel, nil
}
