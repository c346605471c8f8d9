package relay

import (
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

// Liveness PostgreSQL can see. Each relay registers in outbox_relays and
// heartbeats every fifth of RelayTimeout, on a connection of its own so a
// pool busy with deliveries never makes a live relay look dead. A relay is
// alive while its heartbeat is younger than its own RelayTimeout; its
// leases last as long, and its claims are lost when it is not alive
// (recovery.go).
//
// A relay acts only while it knows itself alive: counted from the moment
// it sent its latest heartbeat that was answered, RelayTimeout less one
// heartbeat interval. Past that, its sessions cut off their requests and
// claim nothing (session.run), before any other relay can judge it dead
// and send its claims again. So a relay that is alive but cut off from
// the database (a partition, a pause) never has a request in flight beside
// the one that replaces it.

// alive says whether this relay may still act: its latest answered
// heartbeat was sent less than RelayTimeout less a heartbeat interval ago.
func (r *Relay) alive() bool {
	since := time.Since(r.started) - time.Duration(r.beatSent.Load())
	return since < r.cfg.RelayTimeout-r.cfg.heartbeatInterval()
}

// keepAlive heartbeats and drops deleted endpoints' metric series, until
// ctx is done.
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

// beat is one heartbeat. Answered, it keeps the relay alive from when it
// was sent.
func (r *Relay) beat(ctx context.Context, conn *pgx.Conn) error {
	q := outboxdb.New(conn)
	var claimed *time.Time
	if ns := r.claimedAt.Load(); ns != 0 {
		t := r.dbTime(time.Unix(0, ns))
		claimed = &t
	}
	sent, since := r.now(), time.Since(r.started)
	dbNow, err := q.RelayHeartbeat(ctx, claimed, r.id)
	if errors.Is(err, pgx.ErrNoRows) {
		// Declared dead while alive (a long pause, a lost connection): its
		// claims were lost and may be sent by others now. Its jobs find
		// their leases gone, or held again once it is back.
		host, _ := os.Hostname()
		if dbNow, err = q.RelayRegister(ctx, r.register(host)); err != nil {
			return fmt.Errorf("registering again: %w", err)
		}
		r.logger.WarnContext(ctx, "this relay was declared dead by another and has registered again; its claims were released",
			slog.String("relay_id", r.id.String()), slog.Duration("relay_timeout", r.cfg.RelayTimeout))
	}
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	r.beatSent.Store(int64(since))
	r.measureSkew(sent, dbNow)
	return nil
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
