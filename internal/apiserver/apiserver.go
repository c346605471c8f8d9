// Package apiserver is the api process: the orders HTTP API and the outbox
// admin routes, with health and metrics. cmd/api runs it alone; cmd/dev runs
// it beside the worker.
package apiserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/telemetry"
)

// config is everything the api reads from its environment, parsed once.
type config struct {
	databaseURL  string
	addr         string
	adminToken   string
	logFormat    string
	allowPrivate bool
	notify       bool
	tracing      telemetry.Config
}

func parseConfig(getenv func(string) string) (config, error) {
	env := process.NewEnv(getenv)
	c := config{
		databaseURL:  env.DatabaseURL(),
		addr:         env.String("API_ADDR", "127.0.0.1:8080"),
		adminToken:   getenv("ADMIN_TOKEN"),
		logFormat:    env.OneOf("LOG_FORMAT", "", "", "text", "json"),
		allowPrivate: env.Bool("OUTBOX_ALLOW_PRIVATE_TARGETS", false),
		notify:       env.Bool("OUTBOX_NOTIFY", false),
		tracing:      telemetry.FromEnv(env, "orders-api"),
	}
	return c, env.Err()
}

// Run runs the api process: `args` empty serves, `migrate` migrates and
// exits. It returns when ctx is done and the server has shut down.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, err := parseConfig(getenv)
	if err != nil {
		return err
	}
	migrateOnly := false
	if len(args) > 0 {
		if args[0] != "migrate" || len(args) > 1 {
			return fmt.Errorf("unknown command %q (want no command, or migrate)", args)
		}
		migrateOnly = true
	}
	logger := process.NewLogger(stdout, cfg.logFormat)

	pool, err := process.OpenPool(ctx, cfg.databaseURL, 0, func(c *pgxpool.Config) {
		if cfg.notify {
			// Order transactions wake listening workers at commit.
			outbox.NotifyRelays(c.ConnConfig)
		}
	})
	if err != nil {
		return err
	}
	defer pool.Close()

	if err := db.Migrate(ctx, pool, logger); err != nil {
		return err
	}
	if migrateOnly {
		logger.InfoContext(ctx, "database is up to date")
		return nil
	}
	// Off (nothing installed) unless an OTEL exporter is configured; with it,
	// requests are traced and orders carry their trace to the webhooks.
	tracing, err := telemetry.Setup(ctx, cfg.tracing, stdout, logger)
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.WithoutCancel(ctx))

	guard := netguard.Guard{AllowPrivate: cfg.allowPrivate}
	ordersSvc := orders.NewService(pool, logger)
	admin := outbox.NewAdmin(pool, guard, logger)
	reg, err := process.NewRegistry(outbox.NewBacklogCollector(pool))
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/orders", ordersSvc.Handler())
	mux.Handle("/orders/", ordersSvc.Handler())
	adminH := requireAdmin(cfg.adminToken, admin.Handler())
	mux.Handle("/webhook-endpoints", adminH)
	mux.Handle("/webhook-endpoints/", adminH)
	mux.Handle("/outbox/", adminH)
	opsH := ops.New(ops.Options{Admin: admin, Token: cfg.adminToken, Logger: logger})
	mux.Handle("/ops", opsH)
	mux.Handle("/ops/", opsH)
	process.Ops(mux, reg, process.PingReady(pool))

	if cfg.adminToken == "" {
		logger.WarnContext(ctx, "ADMIN_TOKEN is not set: admin routes answer 403")
	}
	if err := process.Serve(ctx, logger, "api", cfg.addr, tracing.Handler(mux), 10*time.Second, nil); err != nil {
		return err
	}
	logger.InfoContext(context.WithoutCancel(ctx), "api stopped")
	return nil
}

// requireAdmin guards the admin routes with the bearer token. Without a
// token configured they are closed, never open. Both sides are hashed before
// the constant-time comparison so neither content nor length leaks by timing.
func requireAdmin(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusForbidden, "admin routes are disabled: the server has no ADMIN_TOKEN"))
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		gotSum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(gotSum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="admin"`)
			httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusUnauthorized, "a valid admin bearer token is required"))
			return
		}
		next.ServeHTTP(w, r)
	})
}
