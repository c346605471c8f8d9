package relay

// Dispatch: every relay, every poll interval, finds the destinations with
// due messages that no live job serves and inserts a deliver job for each
// (session.go). It runs in every relay, not as a periodic job of River's
// leader: a leader killed without resigning keeps its lease for about 15
// seconds, and with it every dispatch would stop cluster-wide.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/riverqueue/river"
)

// redispatchAfter is how long a dispatched destination waits for its job to
// take the lease before it is dispatched again (its job may have been lost
// with a relay that fetched it and died before running it).
const redispatchAfter = 5 * time.Second

// dispatchLoop dispatches due destinations every poll interval, and at
// once when woken (listen.go), until ctx is done. It runs in every relay, not as a periodic job of River's leader: a
// leader killed without resigning keeps its lease for about 15 seconds, and
// with it every dispatch would stop cluster-wide.
func (r *Relay) dispatchLoop(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.PollInterval)
	defer ticker.Stop()
	var warned, last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-r.dispatchNow:
			if wait := wakeSpacing - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
		last = time.Now()
		r.metrics.polls.Inc()
		if _, err := r.dispatch(ctx); err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			// The database is unreachable: say so, but not every tick.
			warned = time.Now()
			r.logger.WarnContext(ctx, "dispatching due destinations", slog.Any("error", err))
		}
	}
}

// dispatch finds destinations with due messages that no live job serves and
// inserts a deliver job for each, in one transaction: either a destination
// is marked dispatched and has its job, or neither.
func (r *Relay) dispatch(ctx context.Context) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		ids, err := outboxdb.New(tx).DestinationsDispatch(ctx, redispatchAfter.Seconds(),
			int32(r.cfg.DeliverWorkers))
		if err != nil {
			return fmt.Errorf("finding due destinations: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		params := make([]river.InsertManyParams, len(ids))
		for i, id := range ids {
			params[i] = river.InsertManyParams{Args: deliverArgs{Destination: id}}
		}
		if _, err := r.client.InsertManyTx(ctx, tx, params); err != nil {
			return fmt.Errorf("inserting deliver jobs: %w", err)
		}
		n = len(ids)
		return nil
	})
	return n, err
}
