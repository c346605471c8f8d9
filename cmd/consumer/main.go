// Command consumer is the reference webhook receiver (internal/consumer): it
// verifies each Standard Webhooks delivery and applies it exactly once to a
// per-customer order ledger in its own database.
//
// Environment:
//
//	DATABASE_URL      the consumer's own database (required); it applies its
//	                  own migrations at start
//	CONSUMER_ADDR     listen address (default 127.0.0.1:8090): POST /webhooks,
//	                  GET /stats, /healthz, /readyz, /metrics
//	WEBHOOK_SECRETS   comma-separated whsec_ secrets (required), keys of at
//	                  least 24 bytes; several are accepted at once while a
//	                  secret is rotated
//	LOG_FORMAT        text or json (default: text on a terminal, else json)
//	CONSUMER_INBOX_RETENTION
//	                  how long a webhook-id is remembered for dedup (default
//	                  720h, 30 days); pruned hourly. Keep it beyond the
//	                  sender's retries (27.6 h, up to 30.3 h with their
//	                  jitter; at least 31h is required), its pauses (a
//	                  paused or backing-off endpoint's messages wait) and
//	                  OUTBOX_RETENTION (its replays re-send retained events
//	                  under their ids). An event written longer ago than it,
//	                  and not in the inbox, is refused (422 too_old) and
//	                  logged as an error: its id may have been forgotten
//	                  after it was applied
//	CONSUMER_LATE_AFTER
//	                  an event applied later than this after it was written
//	                  is logged as a warning, "event applied late" (default
//	                  1m; 0 logs none); every event's lag is in
//	                  consumer_event_lag_seconds
//
// For example, with the secret POST /webhook-endpoints returned:
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/consumer WEBHOOK_SECRETS=whsec_… go run ./cmd/consumer
//
// Forgeries and stale deliveries get 401 and write nothing; a redelivery is
// acknowledged 200 and changes nothing; unknown event types are acknowledged
// once and ignored; authentic but unreadable ones get 400; a database failure
// gets 500 and the relay retries. GET /stats reports applied, duplicates,
// ignored, bad_signature, stale_timestamp, bad_request, out_of_order,
// too_old and errors (since start) and inbox_total, ledger_total (from its
// database).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxkit/orders/internal/consumer"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/webhook"
)

// minInboxRetention is the shortest inbox retention that outlasts the
// sender's default retry schedule: 27.6 hours, and each wait may be 10 %
// longer (its jitter), so up to 30.3. It is a floor, not a safe value: a
// paused or backing-off endpoint's messages, and replays, come later still,
// which the 30-day default covers.
const minInboxRetention = 31 * time.Hour

func main() {
	// The first signal starts a graceful stop, once Go's default handling
	// is back, so that a second one ends the process at once.
	signals, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-signals.Done()
		stop()
		cancel()
	}()
	if err := run(ctx, os.Args[1:], os.Environ(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// config is everything the consumer reads from its environment.
type config struct {
	databaseURL string
	addr        string
	logFormat   string
	verifier    *webhook.Verifier
	retention   time.Duration
	lateAfter   time.Duration
	// brokers
	natsURL, natsStream, natsDurable string
	// /brokers
	// misspelt are warnings about variables set but never read.
	misspelt []string
}

// parseConfig reads the consumer's configuration through getenv; environ,
// the variables set, is checked for misspellings of the names read.
func parseConfig(getenv func(string) string, environ []string) (config, error) {
	env := process.NewEnv(getenv)
	c := config{
		databaseURL: env.DatabaseURL(),
		addr:        env.Addr("CONSUMER_ADDR", "127.0.0.1:8090"),
		logFormat:   env.OneOf("LOG_FORMAT", "", "", "text", "json"),
		retention:   env.Duration("CONSUMER_INBOX_RETENTION", 30*24*time.Hour),
		lateAfter:   env.Duration("CONSUMER_LATE_AFTER", time.Minute),
	}
	// brokers
	c.natsURL, c.natsStream, c.natsDurable = env.String("NATS_URL", ""), env.String("NATS_STREAM", ""), env.String("NATS_DURABLE", "ledger")
	if c.natsURL != "" && c.natsStream == "" {
		env.Fail("NATS_STREAM", errors.New("required with NATS_URL: the stream to consume"))
	}
	// /brokers
	// Shorter than the sender's retries, a late retry would find its id
	// forgotten and be applied again.
	if c.retention > 0 && c.retention < minInboxRetention {
		env.Fail("CONSUMER_INBOX_RETENTION", fmt.Errorf("must be at least %s, beyond the sender's retries (up to 30.3 h), got %s", minInboxRetention, c.retention))
	}
	var secrets []string
	for s := range strings.SplitSeq(env.String("WEBHOOK_SECRETS", ""), ",") {
		if s = strings.TrimSpace(s); s != "" {
			secrets = append(secrets, s)
		}
	}
	if len(secrets) == 0 {
		env.Fail("WEBHOOK_SECRETS", errors.New("required: one or more comma-separated whsec_ secrets"))
	} else {
		v, err := webhook.NewVerifier(secrets...)
		if err != nil {
			// The error names the secret's position and the problem, never its value.
			env.Fail("WEBHOOK_SECRETS", err)
		}
		c.verifier = v
	}
	c.misspelt = env.Misspelt(environ)
	return c, env.Err()
}

func run(ctx context.Context, args []string, environ []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	cfg, err := parseConfig(process.Getenv(environ), environ)
	if err != nil {
		return err
	}
	logger := process.NewLogger(stdout, cfg.logFormat).With(slog.String("service", "consumer"))
	for _, w := range cfg.misspelt {
		logger.WarnContext(ctx, w)
	}

	pool, err := process.OpenPool(ctx, cfg.databaseURL, 10)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := consumer.Migrate(ctx, pool, logger); err != nil {
		return err
	}

	c := consumer.New(pool, cfg.verifier, logger, consumer.WithInboxRetention(cfg.retention),
		consumer.WithLateAfter(cfg.lateAfter))
	reg, err := process.NewRegistry(c.Collectors()...)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/webhooks", c)
	mux.Handle("GET /stats", c.StatsHandler())
	process.Ops(mux, logger, reg, process.PingReady(pool))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return process.Serve(gctx, logger, "consumer", cfg.addr, mux, 10*time.Second, nil) })
	g.Go(func() error { pruneInbox(gctx, c, cfg.retention, logger); return nil })
	// brokers
	if cfg.natsURL != "" {
		consume, closeNATS, err := natsConsumer(ctx, cfg, c)
		if err != nil {
			return err
		}
		defer closeNATS()
		g.Go(func() error { return consume(gctx) })
		logger.InfoContext(ctx, "consuming JetStream", slog.String("stream", cfg.natsStream), slog.String("durable", cfg.natsDurable))
	}
	// /brokers
	return g.Wait()
}

// pruneInbox forgets webhook-ids older than retention, at start and every
// hour, until ctx ends. A failed prune is logged and tried again an hour
// later: the inbox only grows meanwhile.
func pruneInbox(ctx context.Context, c *consumer.Consumer, retention time.Duration, logger *slog.Logger) {
	tick := time.NewTicker(time.Hour)
	defer tick.Stop()
	for {
		n, err := c.PruneInbox(ctx, time.Now().Add(-retention))
		switch {
		case err != nil && ctx.Err() == nil:
			logger.WarnContext(ctx, "pruning the inbox", slog.Any("error", err))
		case n > 0:
			logger.InfoContext(ctx, "pruned the inbox", slog.Int64("forgotten", n), slog.Duration("retention", retention))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
