// Package relayworker is the worker process: the outbox relay on River,
// with health and metrics. cmd/worker runs it alone; cmd/dev runs it beside
// the api. Any number may run against one database.
package relayworker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/telemetry"

	// brokers
	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/events"
	// /brokers
)

// config is everything the worker reads from its environment, parsed once.
type config struct {
	databaseURL   string
	addr          string
	logFormat     string
	allowPrivate  bool
	relay         relay.Config
	shutdownGrace time.Duration
	// stallThreshold is how long the oldest deliverable message may wait,
	// with no claim by this worker, before /readyz says the relay is stalled.
	stallThreshold time.Duration
	// idempotencyTTL is how long an order's idempotency key dedupes before
	// the worker clears it.
	idempotencyTTL time.Duration
	// brokers

	// brokers are the servers of broker destinations; unset ones leave
	// their kind unconfigured.
	brokers broker.Config
	// /brokers
	// endpointMetrics reports deliveries by endpoint id too.
	endpointMetrics bool
	tracing         telemetry.Config
	// allowedHosts are the names, beyond IP addresses and localhost, that
	// requests may carry in Host (process.CheckHost).
	allowedHosts process.Hosts
	// warnings are said once the logger exists: settings no longer read.
	warnings []string
}

// parseConfig reads the worker's configuration through getenv; environ, the
// variables set, is checked for misspellings of the names read.
func parseConfig(getenv func(string) string, environ []string) (config, error) {
	env := process.NewEnv(getenv)
	c := defaults()
	c.databaseURL = env.DatabaseURL()
	c.addr = env.Addr("WORKER_ADDR", "127.0.0.1:8081")
	c.logFormat = env.OneOf("LOG_FORMAT", "", "", "text", "json")
	c.allowPrivate = env.Bool("OUTBOX_ALLOW_PRIVATE_TARGETS", false)
	c.tracing = telemetry.FromEnv(env, "orders-worker")
	parseSettings(env, &c)
	validateSettings(env, getenv, c)
	for _, name := range slices.Sorted(maps.Keys(retired)) {
		if getenv(name) != "" {
			c.warnings = append(c.warnings, name+" is no longer read: "+retired[name])
		}
	}
	if len(c.allowedHosts) == 0 && !process.LoopbackOnly(c.addr) {
		c.warnings = append(c.warnings, "WORKER_ALLOWED_HOSTS is not set: requests that reach the worker by a name "+
			"(Host: worker-0.orders.svc) are answered 421, only its IP addresses and localhost are accepted; list the names scrapers use")
	}
	if c.relay.SecretKeys == nil {
		c.warnings = append(c.warnings, "OUTBOX_SECRET_KEYS is not set: webhook signing secrets are stored in the clear, "+
			"so whoever reads a database dump or replica can sign webhooks (docs/operations.md)")
	}
	c.warnings = append(c.warnings, env.Misspelt(environ)...)
	return c, env.Err()
}

// Run runs the worker process until ctx is done, then stops the relay
// gracefully: requests in flight get WORKER_SHUTDOWN_GRACE to finish, then
// are cut off; either way their outcomes are recorded and nothing stays
// claimed. environ is its configuration, as os.Environ gives it.
func Run(ctx context.Context, args []string, environ []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	cfg, err := parseConfig(process.Getenv(environ), environ)
	if err != nil {
		return err
	}
	logger := process.NewLogger(stdout, cfg.logFormat)
	for _, w := range cfg.warnings {
		logger.WarnContext(ctx, w)
	}
	// Off unless an OTEL exporter is configured; with it, each delivery is a
	// span in the trace of the request that placed the order, and River's
	// jobs are traced.
	tracing, err := telemetry.Setup(ctx, cfg.tracing, stdout, logger)
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.WithoutCancel(ctx))
	cfg.relay.TracerProvider = tracing.Provider

	// Deliver jobs hold a connection only for each claim and record, so a
	// modest pool serves many destinations at once.
	pool, err := process.OpenPool(ctx, cfg.databaseURL, 20)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := db.Migrate(ctx, pool, logger); err != nil {
		return err
	}

	// The orders module's upkeep runs on the relay's River leader, like the
	// prune: idempotency keys past their time to live are cleared.
	ordersSvc := orders.NewService(pool, logger)
	cfg.relay.Chores = append(cfg.relay.Chores, relay.Chore{Name: "orders_idempotency_expiry",
		Run: func(ctx context.Context) error {
			n, err := ordersSvc.ExpireIdempotencyKeys(ctx, cfg.idempotencyTTL)
			if n > 0 {
				logger.InfoContext(ctx, "idempotency keys expired", slog.Int64("count", n),
					slog.Duration("ttl", cfg.idempotencyTTL))
			}
			return err
		}})

	var metricsOpts []relay.MetricsOption
	if !cfg.endpointMetrics {
		metricsOpts = append(metricsOpts, relay.WithoutEndpointMetrics())
	}
	metrics := relay.NewMetrics(metricsOpts...)
	guard := netguard.Guard{AllowPrivate: cfg.allowPrivate}
	// Each destination is sent by the transport of its kind: webhooks over
	// HTTP through the SSRF guard, broker destinations to the brokers this
	// worker is configured with, each event naming its type's schema in
	// the catalog as its CloudEvents dataschema.
	router := relay.Router{destination.KindWebhook: &relay.HTTPTransport{Client: guard.Client(), UserAgent: process.UserAgent()}}
	// brokers
	brokers := cfg.brokers
	brokers.DataSchemas = map[string]string{}
	for _, et := range events.Catalog().Types() {
		brokers.DataSchemas[et.Name] = et.SchemaID()
	}
	closeBrokers, err := addBrokers(router, brokers)
	if err != nil {
		return err
	}
	defer closeBrokers()
	// /brokers
	maxAttempts := cmp.Or(cfg.relay.MaxAttempts, relay.DefaultConfig().MaxAttempts)
	rl, err := relay.New(pool, cfg.relay, router, logger, metrics)
	if err != nil {
		return err
	}
	backlog := admin.NewBacklogCollector(pool, admin.WithPoisonedMessages(maxAttempts))
	defer backlog.Close() // before pool.Close, which waits for its connection
	httpMetrics := process.NewHTTPMetrics()
	reg, err := process.NewRegistry(append(httpMetrics.Collectors(), backlog, process.NewPoolCollector(pool, "worker"))...)
	if err != nil {
		return err
	}
	if err := metrics.Register(reg); err != nil {
		return fmt.Errorf("registering relay metrics: %w", err)
	}
	mux := http.NewServeMux()
	ping := process.PingReady(pool)
	process.Ops(mux, logger, reg, func(ctx context.Context) error {
		if err := ping(ctx); err != nil {
			return err
		}
		return rl.CheckStalled(ctx, cfg.stallThreshold)
	})

	if err := rl.Start(ctx); err != nil {
		return err
	}
	// The same Host check as the api's listeners: a page that rebinds its
	// name to a loopback worker (cmd/dev's) would otherwise read its
	// metrics, endpoint ids and all.
	serveErr := process.Serve(ctx, logger, "worker", cfg.addr,
		httpMetrics.Wrap(process.CheckHost(mux, "WORKER_ALLOWED_HOSTS", cfg.allowedHosts)), 5*time.Second, nil)
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.shutdownGrace)
	defer cancel()
	return errors.Join(serveErr, rl.Stop(stopCtx))
}
