package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
)

// relaySetup is one relay as cmd/worker wires it: a pool of its own, the
// relay, and its River client.
type relaySetup struct {
	Config    outbox.RelayConfig
	Transport outbox.Transport
	PoolSize  int32 // 0: 20, as cmd/worker
	// FetchCooldown, when set, builds the River client here with this
	// cooldown instead of relay.NewRiverClient (which uses 10 ms): the knob
	// study only.
	FetchCooldown time.Duration
	// FetchPollInterval, when set, likewise overrides River's fetch poll
	// (relay.NewRiverClient sets it to the poll interval).
	FetchPollInterval time.Duration
}

type runningRelay struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
	relay  *outbox.Relay
	tracer *stmtTracer

	stopTicks func()
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
	var tracer *stmtTracer
	if os.Getenv("BENCH_TRACE") != "" {
		tracer = newStmtTracer()
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(pool, s.Config, s.Transport, discard, nil)
	if err != nil {
		pool.Close()
		return nil, err
	}
	var client *river.Client[pgx.Tx]
	if s.FetchCooldown > 0 || s.FetchPollInterval > 0 {
		client, err = customRiverClient(relay, pool, s.FetchCooldown, s.FetchPollInterval)
	} else {
		client, err = relay.NewRiverClient()
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := client.Start(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("starting river: %w", err)
	}
	// As cmd/worker: the poll loop that starts claim jobs runs beside the
	// River client, in every relay process.
	tickCtx, stopTicks := context.WithCancel(context.WithoutCancel(ctx))
	ticked := make(chan struct{})
	go func() { defer close(ticked); relay.TickClaims(tickCtx, client) }()
	return &runningRelay{pool: pool, client: client, relay: relay, tracer: tracer,
		stopTicks: func() { stopTicks(); <-ticked }}, nil
}

// customRiverClient mirrors outbox.Relay.NewRiverClient with another
// FetchCooldown.
func customRiverClient(relay *outbox.Relay, pool *pgxpool.Pool, cooldown, fetchPoll time.Duration) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	relay.AddWorkers(workers)
	c := relay.Config()
	if cooldown == 0 {
		cooldown = 10 * time.Millisecond
	}
	if fetchPoll == 0 {
		fetchPoll = max(c.PollInterval, cooldown)
	}
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:                      slog.New(slog.DiscardHandler),
		Queues:                      relay.Queues(),
		Workers:                     workers,
		PeriodicJobs:                relay.PeriodicJobs(),
		FetchCooldown:               cooldown,
		FetchPollInterval:           fetchPoll,
		RescueStuckJobsAfter:        c.ClaimTimeout + time.Minute,
		CompletedJobRetentionPeriod: time.Hour,
	})
}

func (r *runningRelay) stop() {
	r.stopTicks()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.client.Stop(ctx); err != nil {
		_ = r.client.StopAndCancel(context.Background())
	}
	r.pool.Close()
	if r.tracer != nil {
		r.tracer.print()
	}
}

// httpTransport is the real webhook transport, allowed to reach loopback.
func httpTransport() outbox.Transport {
	return &outbox.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}
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

// The claim statement of db/queries/outbox/messages.sql (MessageClaim),
// copied because its sqlc package is internal to the outbox module. The
// smoke test checks that the copy still matches the file.
const claimSQL = `WITH due AS (
    SELECT id FROM outbox_messages
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_messages m
SET status = 'claimed', claim_token = @claim_token::uuid, claimed_at = now(), attempts = m.attempts + 1
FROM due
WHERE m.id = due.id
RETURNING m.id, m.destination;`

// claimStmt is claimSQL with positional parameters ($1 batch size, $2 token).
func claimStmt() string {
	return replaceAll(claimSQL, map[string]string{"@batch_size": "$1", "@claim_token": "$2"})
}

const markDeliveredSQL = `UPDATE outbox_messages
SET status = 'delivered', delivered_at = now(), claim_token = NULL, claimed_at = NULL
WHERE id = ANY ($1::uuid[])`
