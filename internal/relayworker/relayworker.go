// Package relayworker is the worker process: the outbox relay on River,
// with health and metrics. cmd/worker runs it alone; cmd/dev runs it beside
// the api. Any number may run against one database.
package relayworker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/devdb"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/telemetry"
)

// config is everything the worker reads from its environment, parsed once.
type config struct {
	databaseURL   string
	addr          string
	logFormat     string
	allowPrivate  bool
	relay         outbox.RelayConfig
	shutdownGrace time.Duration
	// stallThreshold is how long the oldest due message may wait, with no
	// claim by this worker, before /readyz says the relay is stalled.
	stallThreshold time.Duration
	tracing        telemetry.Config
}

// relayVars names the variable behind each RelayConfig field.
var relayVars = map[string]string{
	"PollInterval": "OUTBOX_POLL_INTERVAL", "BatchSize": "OUTBOX_BATCH_SIZE", "MaxAttempts": "OUTBOX_MAX_ATTEMPTS",
	"BackoffBase": "OUTBOX_BACKOFF_BASE", "BackoffMax": "OUTBOX_BACKOFF_MAX", "ClaimTimeout": "OUTBOX_CLAIM_TIMEOUT",
	"DeliveryTimeout": "OUTBOX_DELIVERY_TIMEOUT", "Retention": "OUTBOX_RETENTION", "PruneInterval": "OUTBOX_PRUNE_INTERVAL",
	"MaxInFlight": "OUTBOX_MAX_IN_FLIGHT", "DeliverBatch": "OUTBOX_DELIVER_BATCH",
	"DeliverConcurrency": "OUTBOX_DELIVER_CONCURRENCY", "DeliverWorkers": "OUTBOX_DELIVER_WORKERS",
}

func parseConfig(getenv func(string) string) (config, error) {
	env := process.NewEnv(getenv)
	d := outbox.DefaultRelayConfig()
	c := config{
		databaseURL:  env.DatabaseURL(),
		addr:         env.String("WORKER_ADDR", "127.0.0.1:8081"),
		logFormat:    env.OneOf("LOG_FORMAT", "", "", "text", "json"),
		allowPrivate: env.Bool("OUTBOX_ALLOW_PRIVATE_TARGETS", false),
		relay: outbox.RelayConfig{
			PollInterval:       env.Duration("OUTBOX_POLL_INTERVAL", d.PollInterval),
			BatchSize:          env.Int("OUTBOX_BATCH_SIZE", d.BatchSize),
			MaxAttempts:        env.Int("OUTBOX_MAX_ATTEMPTS", d.MaxAttempts),
			BackoffBase:        env.Duration("OUTBOX_BACKOFF_BASE", d.BackoffBase),
			BackoffMax:         env.Duration("OUTBOX_BACKOFF_MAX", d.BackoffMax),
			ClaimTimeout:       env.Duration("OUTBOX_CLAIM_TIMEOUT", d.ClaimTimeout),
			DeliveryTimeout:    env.Duration("OUTBOX_DELIVERY_TIMEOUT", d.DeliveryTimeout),
			Retention:          env.Duration("OUTBOX_RETENTION", d.Retention),
			PruneInterval:      env.Duration("OUTBOX_PRUNE_INTERVAL", d.PruneInterval),
			MaxInFlight:        env.Int("OUTBOX_MAX_IN_FLIGHT", d.MaxInFlight),
			DeliverBatch:       env.Int("OUTBOX_DELIVER_BATCH", d.DeliverBatch),
			DeliverConcurrency: env.Int("OUTBOX_DELIVER_CONCURRENCY", d.DeliverConcurrency),
			DeliverWorkers:     env.Int("OUTBOX_DELIVER_WORKERS", d.DeliverWorkers),
		},
		shutdownGrace:  env.Duration("WORKER_SHUTDOWN_GRACE", 15*time.Second),
		stallThreshold: env.Duration("OUTBOX_STALL_THRESHOLD", 2*time.Minute),
		tracing:        telemetry.FromEnv(env, "orders-worker"),
	}
	if err := c.relay.Validate(); err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			var fe *outbox.FieldError
			if errors.As(e, &fe) {
				env.Fail(relayVars[fe.Field], errors.New(fe.Msg))
			}
		}
	}
	return c, env.Err()
}

// Run runs the worker process until ctx is done, then stops the relay
// gracefully (see stopRiver).
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	cfg, err := parseConfig(getenv)
	if err != nil {
		return err
	}
	logger := process.NewLogger(stdout, cfg.logFormat)
	// Off unless an OTEL exporter is configured; with it, each delivery is a
	// span in the trace of the request that placed the order, and River's
	// jobs are traced.
	tracing, err := telemetry.Setup(ctx, cfg.tracing, stdout, logger)
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.WithoutCancel(ctx))
	cfg.relay.TracerProvider = tracing.Provider

	database, err := devdb.Ensure(ctx, devdb.Options{URL: cfg.databaseURL, Logger: logger})
	if err != nil {
		return err
	}
	defer database.Close()
	// Deliver workers each hold a connection only briefly (load, then
	// record), so a modest pool serves many concurrent jobs.
	pool, err := process.OpenPool(ctx, database.URL, 20)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := db.Migrate(ctx, pool, logger); err != nil {
		return err
	}

	metrics := outbox.NewMetrics()
	guard := netguard.Guard{AllowPrivate: cfg.allowPrivate}
	relay, err := outbox.NewRelay(pool, cfg.relay, &outbox.HTTPTransport{Client: guard.Client()}, logger, metrics)
	if err != nil {
		return err
	}
	client, err := relay.NewRiverClient()
	if err != nil {
		return err
	}

	reg, err := process.NewRegistry(outbox.NewBacklogCollector(pool))
	if err != nil {
		return err
	}
	if err := metrics.Register(reg); err != nil {
		return fmt.Errorf("registering relay metrics: %w", err)
	}
	mux := http.NewServeMux()
	ping := process.PingReady(pool)
	process.Ops(mux, reg, func(ctx context.Context) error {
		if err := ping(ctx); err != nil {
			return err
		}
		return relay.CheckStalled(ctx, cfg.stallThreshold)
	})

	// River hard-stops (cancels running jobs) when its start context is
	// cancelled, which would cut off in-flight deliveries at SIGTERM and skip
	// the grace period; stopRiver below does the stopping instead.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("starting river: %w", err)
	}
	tickCtx, stopTicking := context.WithCancel(ctx)
	defer stopTicking()
	go relay.TickClaims(tickCtx, client)
	logger.InfoContext(ctx, "relay started",
		slog.Duration("poll_interval", relay.Config().PollInterval),
		slog.Int("batch_size", relay.Config().BatchSize),
		slog.Int("max_attempts", relay.Config().MaxAttempts))

	serveErr := process.Serve(ctx, logger, "worker", cfg.addr, mux, 5*time.Second, nil)
	stopErr := stopRiver(context.WithoutCancel(ctx), client, cfg.shutdownGrace, logger)
	return errors.Join(serveErr, stopErr)
}

// stopRiver lets running jobs finish for up to grace, then cancels them.
// A cancelled deliver job records nothing: its rows stay claimed until the
// claim timeout returns them, and are delivered again (at-least-once).
func stopRiver(ctx context.Context, client *river.Client[pgx.Tx], grace time.Duration, logger *slog.Logger) error {
	softCtx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	err := client.Stop(softCtx)
	if err == nil {
		logger.InfoContext(ctx, "relay stopped")
		return nil
	}
	logger.WarnContext(ctx, "relay did not stop in time; cancelling running jobs", slog.Duration("grace", grace))
	hardCtx, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if err := client.StopAndCancel(hardCtx); err != nil {
		return fmt.Errorf("stopping river: %w", err)
	}
	return nil
}
