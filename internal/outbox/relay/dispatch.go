package relay

// Dispatch: every relay, every poll interval, finds the destinations with
// due messages that no live job serves and inserts a deliver job for each
// (session.go), as many as it has workers for. It runs in every relay, not
// as a periodic job of River's leader: a leader killed without resigning
// keeps its lease for about 15 seconds, and with it every dispatch would
// stop cluster-wide.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/riverqueue/river"
)

// redispatchAfter is how long a dispatched destination waits for its job to
// take the lease before it is dispatched again, if its job no longer waits
// for a worker: it was lost with a relay that fetched it and died before
// running it.
const redispatchAfter = 5 * time.Second

// dispatchLoop dispatches due destinations every poll interval, and at
// once when woken (listen.go), until ctx is done.
func (r *Relay) dispatchLoop(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.PollInterval)
	defer ticker.Stop()
	var warned, last time.Time
	var after uuid.UUID
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
		var err error
		if after, err = r.dispatch(ctx, after); err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			// The database is unreachable: say so, but not every tick.
			warned = time.Now()
			r.logger.WarnContext(ctx, "dispatching due destinations", slog.Any("error", err))
		}
	}
}

// dispatch inserts a deliver job for each destination with due messages
// that no live job serves, as many as this relay has workers less the
// jobs already waiting for one (in any relay), taking the destinations in
// turn from the one after after; it returns where the next poll goes on
// (uuid.Nil: from the start, once a poll found fewer than it could take).
// So the jobs waiting stay fewer than the workers, every due destination
// gets its turn, and one whose job waits is not dispatched again. Each
// destination is marked dispatched and has its job, or neither: one
// transaction.
func (r *Relay) dispatch(ctx context.Context, after uuid.UUID) (uuid.UUID, error) {
	next := after
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		waiting, err := q.DeliverJobsWaiting(ctx)
		if err != nil {
			return fmt.Errorf("counting deliver jobs waiting: %w", err)
		}
		room := r.cfg.DeliverWorkers - int(waiting)
		if room <= 0 {
			r.othersDue.Store(true)
			return nil
		}
		ids, err := q.DestinationsDispatch(ctx, after, redispatchAfter.Seconds(), int32(room))
		if err != nil {
			return fmt.Errorf("finding due destinations: %w", err)
		}
		next = uuid.Nil
		if len(ids) == room {
			next = slices.MaxFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
		}
		r.othersDue.Store(waiting > 0 || len(ids) == room)
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
		return nil
	})
	if err != nil {
		return after, err
	}
	return next, nil
}
