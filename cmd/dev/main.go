// Command dev runs the whole service on one machine, for development and
// workshops: the api, the worker and a demo webhook receiver that verifies
// and logs every delivery, on one database.
//
// The database is DATABASE_URL if set, else PostgreSQL on 127.0.0.1:5432
// (database devdb.LocalDatabase, named after the service), else a throwaway
// PostgreSQL that dev starts and removes. Other settings are the api's and
// worker's (docs/reference.md), with development defaults:
// ADMIN_TOKEN=dev-admin-token and private webhook targets allowed.
// DEV_RECEIVER_ADDR (default 127.0.0.1:8082) places the demo receiver;
// DEV_RECEIVER=false leaves it out.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/devdb"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/relayworker"
	"github.com/outboxkit/orders/internal/secretbox"
	"github.com/outboxkit/orders/internal/webhook"
)

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
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, environ []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q", args)
	}
	getenv := process.Getenv(environ)
	cfg, err := parseConfig(getenv, environ)
	if err != nil {
		return err
	}
	// The api and the worker share this output, and each says what is
	// wrong with the configuration both read.
	stdout = &warnOnce{w: stdout, seen: map[string]bool{}}
	logger := process.NewLogger(stdout, cfg.logFormat)
	for _, w := range cfg.misspelt {
		logger.WarnContext(ctx, w)
	}

	// One database for both processes: left to themselves, each would find
	// or start its own.
	database, err := devdb.Ensure(ctx, devdb.Options{URL: cfg.databaseURL, Logger: logger})
	if err != nil {
		return err
	}
	defer database.Close()
	defaults := map[string]string{
		"DATABASE_URL":                 database.URL,
		"ADMIN_TOKEN":                  "dev-admin-token",
		"API_ADDR":                     "127.0.0.1:8080",
		"OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
	}
	// The children's environment: the defaults first, where the first of a
	// name wins, for the variables unset or empty, and always the database.
	var child []string
	for _, name := range slices.Sorted(maps.Keys(defaults)) {
		if name == "DATABASE_URL" || getenv(name) == "" {
			child = append(child, name+"="+defaults[name])
		}
	}
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); name != "DATABASE_URL" {
			child = append(child, kv)
		}
	}
	childEnv := process.Getenv(child)

	pool, err := process.OpenPool(ctx, database.URL, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := db.Migrate(ctx, pool, logger); err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	if cfg.withReceiver {
		handler, err := registerReceiver(gctx, pool, cfg.receiverAddr, cfg.secretKeys, logger)
		if err != nil {
			return err
		}
		g.Go(func() error {
			return process.Serve(gctx, logger, "demo receiver", cfg.receiverAddr, handler, 5*time.Second, nil)
		})
	}
	// The development default token is printed so the README's curl lines
	// work; a token the user chose is never logged.
	token := "(from ADMIN_TOKEN)"
	if getenv("ADMIN_TOKEN") == "" {
		token = defaults["ADMIN_TOKEN"]
	}
	attrs := []any{slog.String("api", "http://"+childEnv("API_ADDR")), slog.String("admin_token", token)}
	if a := childEnv("ADMIN_ADDR"); a != "" {
		// The ops page and the admin routes are there, not on the api.
		attrs = append(attrs, slog.String("admin", "http://"+a))
	}
	logger.InfoContext(ctx, "dev: api, worker and receiver starting", attrs...)
	g.Go(func() error { return apiserver.Run(gctx, nil, child, stdout) })
	g.Go(func() error { return relayworker.Run(gctx, nil, child, stdout) })
	return g.Wait()
}

// config is what dev reads itself; every other variable is the api's and
// the worker's, which read it from the environment dev hands them.
type config struct {
	logFormat    string
	receiverAddr string
	withReceiver bool
	databaseURL  string
	// secretKeys seal the demo receiver's secret as the api seals secrets.
	secretKeys *secretbox.Keyring
	// misspelt warns of DEV_ variables set but never read: the api and the
	// worker warn of the others, the names they read.
	misspelt []string
}

// parseConfig reads dev's own settings through getenv; environ, the
// variables set, is checked for misspellings of dev's own names.
func parseConfig(getenv func(string) string, environ []string) (config, error) {
	env := process.NewEnv(getenv)
	c := config{
		logFormat:    env.OneOf("LOG_FORMAT", "", "", "text", "json"),
		receiverAddr: env.String("DEV_RECEIVER_ADDR", "127.0.0.1:8082"),
		withReceiver: env.Bool("DEV_RECEIVER", true),
		databaseURL:  env.OptionalDatabaseURL(),
	}
	keys, err := secretbox.Parse(env.String("OUTBOX_SECRET_KEYS", ""))
	if err != nil {
		env.Fail("OUTBOX_SECRET_KEYS", err)
	}
	c.secretKeys = keys
	var own []string
	for _, kv := range environ {
		if strings.HasPrefix(kv, "DEV_") {
			own = append(own, kv)
		}
	}
	c.misspelt = env.Misspelt(own)
	return c, env.Err()
}

// events is every event type the service's modules emit: a new module adds
// its Events here.
func events() []string { return slices.Concat(orders.Events) }

// registerReceiver subscribes the demo receiver to every event the service
// emits and returns a handler that verifies and logs each delivery. An
// earlier run's registration of the same URL is kept, with a new secret and
// today's events, so its id and history stay and what it still waits for
// is delivered to this run.
func registerReceiver(ctx context.Context, pool *pgxpool.Pool, addr string, keys *secretbox.Keyring, logger *slog.Logger) (http.Handler, error) {
	svc := admin.New(pool, netguard.Guard{AllowPrivate: true}, logger, admin.WithSecretKeys(keys))
	url := "http://" + addr + "/webhooks"
	existing, err := svc.Endpoints(ctx)
	if err != nil {
		return nil, err
	}
	var ep admin.Endpoint
	want := slices.Sorted(slices.Values(events()))
	for _, e := range existing {
		if e.URL != url {
			continue
		}
		if !slices.Equal(e.EventTypes, want) {
			// The modules changed: the same endpoint, subscribed to them now.
			if _, err := svc.UpdateEndpoint(ctx, e.ID, admin.EndpointChange{EventTypes: want}); err != nil {
				return nil, fmt.Errorf("subscribing the demo receiver to every event: %w", err)
			}
		}
		if ep, err = svc.RotateSecret(ctx, e.ID, 0); err != nil {
			return nil, fmt.Errorf("renewing the demo receiver's secret: %w", err)
		}
		if !ep.Enabled {
			if _, err := svc.SetEndpointEnabled(ctx, e.ID, true); err != nil {
				return nil, err
			}
		}
		break
	}
	if ep.ID == uuid.Nil {
		if ep, err = svc.CreateEndpoint(ctx, url, events()); err != nil {
			return nil, fmt.Errorf("registering demo receiver: %w", err)
		}
	}
	verifier, err := webhook.NewVerifier(ep.Secret)
	if err != nil {
		return nil, err
	}
	return &receiver{verifier: verifier, logger: logger.With(slog.String("component", "demo_receiver"))}, nil
}

// receiver logs each delivery after verifying its signature; it answers 204
// so the relay marks the message delivered.
type receiver struct {
	verifier *webhook.Verifier
	logger   *slog.Logger
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if err := rc.verifier.Verify(r.Header, body); err != nil {
		rc.logger.WarnContext(r.Context(), "webhook rejected", slog.Any("error", err))
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var env struct {
		Type string `json:"type"`
		Data struct {
			ID         string `json:"id"`
			TotalCents int64  `json:"total_cents"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &env)
	rc.logger.InfoContext(r.Context(), "webhook received",
		slog.String("webhook_id", r.Header.Get(webhook.HeaderID)),
		slog.String("type", env.Type),
		slog.String("order_id", env.Data.ID),
		slog.Int64("total_cents", env.Data.TotalCents),
		slog.Bool("signature_valid", true))
	w.WriteHeader(http.StatusNoContent)
}

// warnOnce writes log lines through, but a warning already written, told
// apart by everything after its time: the api and the worker each warn of
// OUTBOX_SECRET_KEYS unset or of a misspelt name both read, and in dev's
// one output once is enough. A log handler writes one line per Write.
type warnOnce struct {
	mu   sync.Mutex
	w    io.Writer
	seen map[string]bool
}

func (o *warnOnce) Write(p []byte) (int, error) {
	line := string(p)
	i := strings.Index(line, `"level":"WARN"`) // JSON
	if i < 0 {
		i = strings.Index(line, "WRN") // text
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if i >= 0 {
		if o.seen[line[i:]] {
			return len(p), nil
		}
		o.seen[line[i:]] = true
	}
	return o.w.Write(p)
}
