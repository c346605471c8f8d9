package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Recovery: what a relay can no longer finish goes back to work. Every
// relay, every heartbeat interval, releases the lost claims of every
// destination (a claim is lost when its relay is not alive, or when it is
// older than its relay's claim timeout: recovery.sql), each counted as an
// attempt that may have reached the receiver, and promotes their keys. A
// SIGKILLed worker's messages are thus delivered by a survivor within its
// relay timeout and a beat. Each destination is released in a transaction
// of its own that waits at most recoveryLockWait for a lock: a lock held
// on one destination (a frozen worker mid-statement, an operator's open
// transaction) delays that destination's release to the next pass, never
// another's.
//
// A job that could not write its end (the database away) keeps it in
// memory, and the recovery pass retries it (deferSettle): the outcomes
// are recorded late rather than the messages sent twice.

// recoveryLockWait bounds how long one destination's release waits for a
// lock before it is left to the next pass.
const recoveryLockWait = time.Second

// recoverLoop runs a recovery pass every heartbeat interval until ctx is
// done.
func (r *Relay) recoverLoop(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.heartbeatInterval())
	defer ticker.Stop()
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		passCtx, cancel := context.WithTimeout(ctx, r.cfg.RelayTimeout)
		err := r.recover(passCtx)
		cancel()
		if err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			warned = time.Now()
			r.logger.WarnContext(ctx, "releasing lost claims", slog.Any("error", err))
		}
	}
}

// recover is one pass: the jobs' deferred writes, the dead relays said,
// and every destination's lost claims released.
func (r *Relay) recover(ctx context.Context) error {
	r.retryUnsettled(ctx)
	q := outboxdb.New(r.pool)
	dead, err := q.RelaysDeclareDead(ctx)
	if err != nil {
		return fmt.Errorf("declaring dead relays: %w", err)
	}
	if len(dead) > 0 {
		r.metrics.relaysDeclaredDead.Add(float64(len(dead)))
		ids := make([]string, len(dead))
		for i, id := range dead {
			ids[i] = id.String()
		}
		r.logger.WarnContext(ctx, "relays declared dead; their claims are released", slog.Any("relay_ids", ids),
			slog.Duration("relay_timeout", r.cfg.RelayTimeout))
	}
	dests, err := q.ClaimsLostDestinations(ctx)
	if err != nil {
		return fmt.Errorf("finding lost claims: %w", err)
	}
	var errs []error
	for _, dest := range dests {
		if err := r.releaseLost(ctx, dest); err != nil {
			errs = append(errs, fmt.Errorf("destination %s: %w", dest, err))
		}
	}
	return errors.Join(errs...)
}

// releaseLost releases one destination's lost claims and promotes their
// keys, under the destination's lock.
func (r *Relay) releaseLost(ctx context.Context, dest uuid.UUID) error {
	var rows []outboxdb.MessagesReleaseLostRow
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", recoveryLockWait.Milliseconds())); err != nil {
			return fmt.Errorf("bounding lock waits: %w", err)
		}
		q := outboxdb.New(tx)
		if err := q.DestinationLock(ctx, dest); err != nil {
			return fmt.Errorf("locking destination: %w", err)
		}
		var err error
		if rows, err = q.MessagesReleaseLost(ctx, dest, int32(r.cfg.MaxAttempts)); err != nil {
			return fmt.Errorf("releasing lost claims: %w", err)
		}
		keys := make([]*string, len(rows))
		for i, row := range rows {
			keys[i] = row.OrderingKey
		}
		return promote(ctx, q, dest, keys)
	})
	if err != nil {
		return err
	}
	var gone, stale int
	for _, row := range rows {
		if row.RelayGone != nil && *row.RelayGone {
			gone++
		} else {
			stale++
		}
	}
	if gone > 0 {
		r.metrics.released.WithLabelValues("relay_dead").Add(float64(gone))
		r.logger.WarnContext(ctx, "released the claims of a relay that stopped", slog.String("destination", dest.String()),
			slog.Int("count", gone))
	}
	if stale > 0 {
		r.metrics.released.WithLabelValues("claim_timeout").Add(float64(stale))
		r.logger.WarnContext(ctx, "released claims past the claim timeout", slog.String("destination", dest.String()),
			slog.Int("count", stale), slog.Duration("claim_timeout", r.cfg.ClaimTimeout))
	}
	return nil
}

// leave is the end of a graceful stop: the jobs' deferred writes are tried
// once more, the relay leaves outbox_relays, and whatever it still claims
// (nothing, when every job settled) is lost from then on, and released at
// once rather than at another relay's next pass.
func (r *Relay) leave(ctx context.Context) error {
	r.retryUnsettled(ctx)
	if err := outboxdb.New(r.pool).RelayUnregister(ctx, r.id); err != nil {
		return fmt.Errorf("leaving: %w", err)
	}
	if err := r.recover(ctx); err != nil {
		return fmt.Errorf("leaving: %w", err)
	}
	return nil
}

// deferSettle keeps a job's final writes to retry at the next passes.
func (r *Relay) deferSettle(f func(context.Context) error) {
	r.mu.Lock()
	r.unsettled = append(r.unsettled, f)
	r.mu.Unlock()
}

// retryUnsettled retries the final writes of jobs that ended while the
// database was unreachable, keeping those that fail again.
func (r *Relay) retryUnsettled(ctx context.Context) {
	r.mu.Lock()
	pending := r.unsettled
	r.unsettled = nil
	r.mu.Unlock()
	var failed []func(context.Context) error
	var firstErr error
	for _, f := range pending {
		if err := f(ctx); err != nil {
			failed = append(failed, f)
			firstErr = cmp.Or(firstErr, err)
		}
	}
	if len(failed) > 0 {
		r.mu.Lock()
		r.unsettled = append(r.unsettled, failed...)
		// Said at most every 30 s: a destination stays leased until its
		// job's final writes succeed.
		warn := time.Since(r.unsettledWarned) > 30*time.Second
		if warn {
			r.unsettledWarned = time.Now()
		}
		r.mu.Unlock()
		if warn && ctx.Err() == nil {
			r.logger.WarnContext(ctx, "retrying deliver jobs' final writes", slog.Int("jobs", len(failed)), slog.Any("error", firstErr))
		}
	}
}
