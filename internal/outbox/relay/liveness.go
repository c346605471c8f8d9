package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Liveness PostgreSQL can see. Each relay heartbeats in outbox_relays every
// fifth of RelayTimeout; every relay, at each beat, declares dead the relays
// whose heartbeat is older than RelayTimeout and, in the same transaction,
// returns their claims to pending and frees their destinations. A SIGKILLed
// worker's messages are thus delivered by a survivor within seconds. The
// claim timeout stays as the last resort, for a relay that is alive but
// stuck.
//
// The heartbeat has a connection of its own, so a pool busy with deliveries
// never makes a live relay look dead.

// keepAlive heartbeats, reaps dead relays and stale claims, retries
// unsettled writes (beside it) and drops deleted endpoints' metric series,
// until ctx is done.
func (r *Relay) keepAlive(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.heartbeatInterval())
	defer ticker.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	var warned time.Time
	for beats := 1; ; beats++ {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if conn == nil || conn.IsClosed() {
			c, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
			if err != nil {
				if ctx.Err() == nil && time.Since(warned) > 30*time.Second {
					warned = time.Now()
					r.logger.WarnContext(ctx, "relay heartbeat: connecting", slog.Any("error", err))
				}
				continue
			}
			conn = c
		}
		beatCtx, cancel := context.WithTimeout(ctx, r.cfg.RelayTimeout)
		err := r.beat(beatCtx, conn)
		if err == nil && beats%forgetEvery == 0 {
			err = r.forgetDeleted(beatCtx, conn)
		}
		cancel()
		r.retryUnsettledAside(ctx)
		if err != nil && ctx.Err() == nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			conn = nil
			if time.Since(warned) > 30*time.Second {
				warned = time.Now()
				r.logger.WarnContext(ctx, "relay heartbeat", slog.Any("error", err))
			}
		}
	}
}

// beat is one heartbeat and one look for dead relays and stale claims.
func (r *Relay) beat(ctx context.Context, conn *pgx.Conn) error {
	q := outboxdb.New(conn)
	var claimed *time.Time
	if ns := r.claimedAt.Load(); ns != 0 {
		t := r.dbTime(time.Unix(0, ns))
		claimed = &t
	}
	sent := r.now()
	dbNow, err := q.RelayHeartbeat(ctx, claimed, r.id)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("heartbeat: %w", err)
	}
	if err == nil {
		r.measureSkew(sent, dbNow)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// Declared dead while alive (a long pause, a lost connection): its
		// claims and leases were released and may be served elsewhere now.
		// Its jobs find their leases gone and stop claiming.
		host, _ := os.Hostname()
		if _, err := q.RelayRegister(ctx, r.register(host)); err != nil {
			return fmt.Errorf("registering again: %w", err)
		}
		r.logger.WarnContext(ctx, "this relay was declared dead by another and has registered again; its claims were released",
			slog.String("relay_id", r.id.String()), slog.Duration("relay_timeout", r.cfg.RelayTimeout))
	}
	if err := r.reapDead(ctx, conn); err != nil {
		return err
	}
	stale, err := q.MessageReleaseStale(ctx, r.cfg.ClaimTimeout.Seconds(), int32(r.cfg.MaxAttempts))
	if err != nil {
		return fmt.Errorf("releasing stale claims: %w", err)
	}
	if stale > 0 {
		r.metrics.released.WithLabelValues("claim_timeout").Add(float64(stale))
		r.logger.WarnContext(ctx, "released claims past the claim timeout", slog.Int64("count", stale),
			slog.Duration("claim_timeout", r.cfg.ClaimTimeout))
	}
	return nil
}

// retryUnsettledAside runs retryUnsettled beside the heartbeat, one run at
// a time. Its writes go through the pool, which is the slow part when jobs
// could not settle (saturated, or waiting on locks): a beat that waited for
// them would leave this relay unheard past its timeout, and another would
// declare it dead and release claims whose requests are still in flight.
func (r *Relay) retryUnsettledAside(ctx context.Context) {
	r.mu.Lock()
	none := len(r.unsettled) == 0
	r.mu.Unlock()
	if none || !r.retrying.CompareAndSwap(false, true) {
		return
	}
	r.loops.Go(func() {
		defer r.retrying.Store(false)
		ctx, cancel := context.WithTimeout(ctx, settleTimeout)
		defer cancel()
		r.retryUnsettled(ctx)
	})
}

// forgetEvery is how many heartbeats apart the relay looks for deleted
// endpoints among those it has metric series for: about every 10 s at the
// default relay timeout.
const forgetEvery = 10

// forgetDeleted drops the metric series by endpoint of endpoints deleted
// since they were counted, so that a service whose endpoints come and go
// keeps series only for those that exist.
func (r *Relay) forgetDeleted(ctx context.Context, conn *pgx.Conn) error {
	if r.metrics.byEndpoint == nil {
		return nil
	}
	ids := r.metrics.endpointIDs()
	if len(ids) == 0 {
		return nil
	}
	existing, err := outboxdb.New(conn).EndpointsExisting(ctx, ids)
	if err != nil {
		return fmt.Errorf("looking for deleted endpoints: %w", err)
	}
	present := make(map[uuid.UUID]bool, len(existing))
	for _, id := range existing {
		present[id] = true
	}
	var gone []uuid.UUID
	for _, id := range ids {
		if !present[id] {
			gone = append(gone, id)
		}
	}
	r.metrics.forgetEndpoints(gone)
	return nil
}

// register is this relay's row of outbox_relays.
func (r *Relay) register(host string) outboxdb.RelayRegisterParams {
	return outboxdb.RelayRegisterParams{ID: r.id, Hostname: host, Pid: int32(os.Getpid()),
		TimeoutSeconds: r.cfg.RelayTimeout.Seconds(), ClaimTimeoutSeconds: r.cfg.ClaimTimeout.Seconds()}
}

// reapDead declares dead the relays silent for longer than RelayTimeout and
// releases their claims and leases, all in one transaction.
func (r *Relay) reapDead(ctx context.Context, conn *pgx.Conn) error {
	var dead []uuid.UUID
	var released int64
	err := inTx(ctx, conn, func(tx pgx.Tx) (err error) {
		q := outboxdb.New(tx)
		if dead, err = q.RelaysDeclareDead(ctx); err != nil || len(dead) == 0 {
			return err
		}
		released, err = r.releaseRelays(ctx, q, dead, "the relay delivering it stopped; the receiver may have it")
		return err
	})
	if err != nil {
		return fmt.Errorf("releasing dead relays' work: %w", err)
	}
	if len(dead) > 0 {
		r.metrics.relaysDeclaredDead.Add(float64(len(dead)))
		r.metrics.released.WithLabelValues("relay_dead").Add(float64(released))
		ids := make([]string, len(dead))
		for i, id := range dead {
			ids[i] = id.String()
		}
		r.logger.WarnContext(ctx, "relays declared dead; their claims were released", slog.Any("relay_ids", ids),
			slog.Int64("released", released), slog.Duration("relay_timeout", r.cfg.RelayTimeout))
	}
	return nil
}

// releaseRelays returns the claims of relays to pending (each an
// interrupted attempt), frees the destinations they leased, and returns how
// many claims it released. Its caller's transaction may run again (inTx):
// the count is the last try's, not a sum over tries.
func (r *Relay) releaseRelays(ctx context.Context, q *outboxdb.Queries, relays []uuid.UUID, reason string) (int64, error) {
	n, err := q.MessagesReleaseLost(ctx, reason, relays, int32(r.cfg.MaxAttempts))
	if err != nil {
		return 0, fmt.Errorf("releasing claims: %w", err)
	}
	if err := q.DestinationsReleaseLeases(ctx, relays); err != nil {
		return 0, fmt.Errorf("releasing leases: %w", err)
	}
	return n, nil
}

// leave is the end of a graceful stop: whatever is still claimed or leased
// in this relay's name (nothing, when every job settled) is released, and
// the relay leaves outbox_relays.
func (r *Relay) leave(ctx context.Context) error {
	r.retryUnsettled(ctx)
	var released int64
	err := inTx(ctx, r.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		var err error
		released, err = r.releaseRelays(ctx, q, []uuid.UUID{r.id}, "the relay delivering it stopped before recording the outcome")
		if err != nil {
			return err
		}
		return q.RelayUnregister(ctx, r.id)
	})
	if err != nil {
		return fmt.Errorf("leaving: %w", err)
	}
	if released > 0 {
		r.metrics.released.WithLabelValues("relay_stopped").Add(float64(released))
		r.logger.WarnContext(ctx, "released claims left at stop", slog.Int64("count", released))
	}
	return nil
}

// deferSettle keeps a job's final writes to retry at the next heartbeats.
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
