package main

import (
	"context"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// relaySetup is one relay as cmd/worker wires it: a pool of its own and the
// relay (its River client, dispatch and heartbeat) started on it.
type relaySetup struct {
	Config    relay.Config
	Transport relay.Transport
	PoolSize  int32 // 0: 20, as cmd/worker
}

type runningRelay struct {
	pool   *pgxpool.Pool
	relay  *relay.Relay
	tracer *stmtTracer
}

func startRelay(ctx context.Context, url string, s relaySetup) (*runningRelay, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 20
	if s.PoolSize > 0 {
		cfg.MaxConns = s.PoolSize
	}
	db.ConfigurePool(cfg)
	var tracer *stmtTracer
	if os.Getenv("BENCH_TRACE") != "" {
		tracer = newStmtTracer()
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	relay, err := relay.New(pool, s.Config, s.Transport, discard, nil)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := relay.Start(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return &runningRelay{pool: pool, relay: relay, tracer: tracer}, nil
}

func (r *runningRelay) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = r.relay.Stop(ctx)
	r.pool.Close()
	if r.tracer != nil {
		r.tracer.print()
	}
}

// httpTransport is the real webhook transport, allowed to reach loopback.
func httpTransport() relay.Transport {
	return &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}
}

// relayDrain starts a relay on a preloaded outbox and returns messages/s
// from its start until nothing is pending or claimed.
func relayDrain(ctx context.Context, url string, watch *pgxpool.Pool, n int, s relaySetup) (float64, error) {
	start := time.Now()
	r, err := startRelay(ctx, url, s)
	if err != nil {
		return 0, err
	}
	defer r.stop()
	end, err := waitDrained(ctx, watch, drainLimit(n))
	if err != nil {
		return 0, err
	}
	return float64(n) / end.Sub(start).Seconds(), nil
}

// drainLimit is how long a drain of n messages may take before the
// benchmark calls it stuck: generous, at 500 messages/s.
func drainLimit(n int) time.Duration { return 30*time.Second + time.Duration(n/500)*time.Second }

// rawClaimSQL is the raw loop's claim: the oldest due messages, whatever
// their destination, in one statement with SKIP LOCKED and no lease, each
// returned with its event (id, payload and time, from outbox_events, as the
// relay's claim returns them). It is the floor of what claiming costs, not
// the relay's statement.
const rawClaimSQL = `WITH due AS (
    SELECT id FROM outbox_messages
    WHERE status = 'pending' AND NOT parked AND next_attempt_at <= now()
    ORDER BY destination, next_attempt_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages m
SET status = 'claimed', claim_token = $2::uuid, claimed_at = now()
FROM due, outbox_events ev
WHERE m.id = due.id AND ev.id = m.event_id
RETURNING m.id, m.event_id, m.destination, m.type, ev.payload, ev.created_at`

const markDeliveredSQL = `UPDATE outbox_messages
SET status = 'delivered', delivered_at = now(), claim_token = NULL, claimed_at = NULL
WHERE id = ANY ($1::uuid[])`
