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
	below := uuid.Max
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
		if below, err = r.dispatch(ctx, below); err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			// The database is unreachable: say so, but not every tick.
			warned = time.Now()
			r.logger.WarnContext(ctx, "dispatching due destinations", slog.Any("error", err))
		}
	}
}

// dispatch finds the destinations with due messages that no live job
// serves, as many as this relay has workers less the jobs already waiting
// for one (in any relay), taking them in turn from the one below below,
// marks them dispatched (DestinationsDispatch, one round trip) and inserts
// a deliver job for each; it returns where the next poll goes on
// (uuid.Max: from the top, once a poll found fewer than it could take).
// So the jobs waiting stay fewer than the workers, every due destination
// gets its turn, and one whose job waits is not dispatched again. The
// marks commit before the jobs are inserted: a relay that dies between
// the two, or an insert that fails, leaves destinations marked with no
// job, which any relay's dispatch takes again after redispatchAfter, as
// it does a job lost with a relay that fetched it. The rule is one
// paragraph, and an idle poll is one statement rather than a transaction
// of four round trips, which every relay pays every poll interval.
func (r *Relay) dispatch(ctx context.Context, below uuid.UUID) (uuid.UUID, error) {
	d, err := outboxdb.New(r.pool).DestinationsDispatch(ctx, below, redispatchAfter.Seconds(), int32(r.cfg.DeliverWorkers))
	if err != nil {
		return below, fmt.Errorf("finding due destinations: %w", err)
	}
	room := max(r.cfg.DeliverWorkers-int(d.Waiting), 0)
	r.othersDue.Store(d.Waiting > 0 || len(d.Ids) == room)
	next := uuid.Max
	switch {
	case room == 0:
		next = below // nothing was looked at
	case len(d.Ids) == room:
		next = slices.MinFunc(d.Ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	}
	if len(d.Ids) == 0 {
		return next, nil
	}
	params := make([]river.InsertManyParams, len(d.Ids))
	for i, id := range d.Ids {
		params[i] = river.InsertManyParams{Args: deliverArgs{Destination: id}}
	}
	// Inserted even when the relay is stopping: marked, they would wait out
	// redispatchAfter.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if _, err := r.client.InsertMany(ictx, params); err != nil {
		return next, fmt.Errorf("inserting deliver jobs: %w", err)
	}
	return next, nil
}
