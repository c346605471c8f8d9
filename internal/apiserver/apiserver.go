// Package apiserver is the api process: the orders HTTP API and the outbox
// admin routes, with health and metrics, on one listener or, with
// ADMIN_ADDR, the admin surface on a second one. cmd/api runs it alone;
// cmd/dev runs it beside the worker.
package apiserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/events"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/secretbox"
	"github.com/outboxkit/orders/internal/telemetry"
	"github.com/outboxkit/orders/openapi"
)

// adminPoolSize is the admin surface's connections: enough for an
// operator's page and a script beside it; more admin requests at once wait
// for one (within their deadline) instead of taking the orders'.
const adminPoolSize = 2

// minAdminToken is the shortest ADMIN_TOKEN accepted when the admin surface
// listens beyond loopback: 32 characters of a random token are out of reach
// of guessing over the network, and `openssl rand -base64 32` gives 44.
const minAdminToken = 32

// config is everything the api reads from its environment, parsed once.
type config struct {
	databaseURL  string
	addr         string
	adminAddr    string
	adminToken   string
	logFormat    string
	allowPrivate bool
	notify       bool
	// opsCookieSecure marks the ops session cookie Secure behind a proxy
	// that terminates TLS.
	opsCookieSecure bool
	// stallThreshold is when the ops page and GET /outbox/relays call the
	// relay stalled.
	stallThreshold time.Duration
	// adminTimeout cancels an admin surface's statement that runs
	// longer (on the admin pool's connections).
	adminTimeout time.Duration
	tracing      telemetry.Config
	// allowedHosts are the names, beyond IP addresses and localhost, that
	// requests may carry in Host (process.CheckHost).
	allowedHosts process.Hosts
	secretKeys   *secretbox.Keyring
	// misspelt are warnings about variables set but never read.
	misspelt []string
}

// parseConfig reads the api's configuration through getenv; environ, the
// variables set, is checked for misspellings of the names read.
func parseConfig(getenv func(string) string, environ []string) (config, error) {
	env := process.NewEnv(getenv)
	c := config{
		databaseURL:     env.DatabaseURL(),
		addr:            env.Addr("API_ADDR", "127.0.0.1:8080"),
		adminAddr:       env.Addr("ADMIN_ADDR", ""),
		adminToken:      env.String("ADMIN_TOKEN", ""),
		allowedHosts:    env.Hosts("API_ALLOWED_HOSTS"),
		logFormat:       env.OneOf("LOG_FORMAT", "", "", "text", "json"),
		allowPrivate:    env.Bool("OUTBOX_ALLOW_PRIVATE_TARGETS", false),
		notify:          env.Bool("OUTBOX_NOTIFY", false),
		opsCookieSecure: env.Bool("OPS_COOKIE_SECURE", false),
		stallThreshold:  env.Duration("OUTBOX_STALL_THRESHOLD", admin.DefaultStallThreshold),
		adminTimeout:    env.Duration("ADMIN_STATEMENT_TIMEOUT", 10*time.Second),
		tracing:         telemetry.FromEnv(env, "orders-api"),
		secretKeys:      parseSecretKeys(env),
	}
	if c.adminToken != strings.TrimSpace(c.adminToken) {
		// A bearer header's value arrives trimmed, so such a token could
		// never match: a secret written from a file with its newline.
		env.Fail("ADMIN_TOKEN", errors.New("has leading or trailing whitespace (a newline from the file it was read from?): no request could present it"))
	}
	if c.adminAddr != "" && c.adminAddr == c.addr {
		env.Fail("ADMIN_ADDR", fmt.Errorf("must differ from API_ADDR (%s): unset it to serve everything there", c.addr))
	}
	if c.adminToken != "" && len(c.adminToken) < minAdminToken && !process.LoopbackOnly(c.adminListener()) {
		env.Fail("ADMIN_TOKEN", fmt.Errorf("must be at least %d characters when the admin routes listen beyond loopback (%s); generate one with `openssl rand -base64 32`, or put them on a loopback ADMIN_ADDR",
			minAdminToken, c.adminListener()))
	}
	c.misspelt = env.Misspelt(environ)
	return c, env.Err()
}

// adminListener is the address the ops page, the admin routes and /metrics
// are served on.
func (c config) adminListener() string { return cmp.Or(c.adminAddr, c.addr) }

// Run runs the api process: `args` empty serves, `migrate` migrates and
// exits, `reencrypt-secrets` migrates, seals every endpoint's signing
// secrets under the first key of OUTBOX_SECRET_KEYS and exits. environ is
// its configuration, as os.Environ gives it. It returns when ctx is done and
// the servers have shut down.
func Run(ctx context.Context, args []string, environ []string, stdout io.Writer) error {
	cfg, err := parseConfig(process.Getenv(environ), environ)
	if err != nil {
		return err
	}
	migrateOnly := false
	reencrypt := len(args) == 1 && args[0] == "reencrypt-secrets"
	if len(args) > 0 && !reencrypt {
		if args[0] != "migrate" || len(args) > 1 {
			return fmt.Errorf("unknown command %q (want no command, migrate or reencrypt-secrets)", args)
		}
		migrateOnly = true
	}
	logger := process.NewLogger(stdout, cfg.logFormat)
	for _, w := range cfg.misspelt {
		logger.WarnContext(ctx, w)
	}

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
	if reencrypt {
		return reencryptSecrets(ctx, pool, cfg.secretKeys, logger)
	}
	// Off (nothing installed) unless an OTEL exporter is configured; with it,
	// requests are traced and orders carry their trace to the webhooks.
	tracing, err := telemetry.Setup(ctx, cfg.tracing, stdout, logger)
	if err != nil {
		return err
	}
	defer tracing.Shutdown(context.WithoutCancel(ctx))

	// The admin surface (the admin API, the ops page and its sessions,
	// River UI) has a small pool of its own: however many admin requests
	// run at once, and however long their reads, they never hold a
	// connection the orders need. Each statement is cancelled past
	// ADMIN_STATEMENT_TIMEOUT, so one expensive read cannot keep even these.
	adminPool, err := process.OpenPool(ctx, cfg.databaseURL, adminPoolSize, func(c *pgxpool.Config) {
		// Whatever the URL's pool_max_conns: that sizes the orders' pool.
		c.MaxConns = adminPoolSize
		c.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.adminTimeout.Milliseconds(), 10)
	})
	if err != nil {
		return err
	}
	defer adminPool.Close()

	guard := netguard.Guard{AllowPrivate: cfg.allowPrivate}
	ordersSvc := orders.NewService(pool, logger)
	adminSvc := admin.New(adminPool, guard, logger, admin.WithSecretKeys(cfg.secretKeys),
		admin.WithStallThreshold(cfg.stallThreshold), admin.WithCatalog(events.Catalog()))
	httpMetrics := process.NewHTTPMetrics()
	backlog := admin.NewBacklogCollector(pool)
	defer backlog.Close() // before pool.Close, which waits for its connection
	reg, err := process.NewRegistry(append(httpMetrics.Collectors(),
		backlog, process.NewPoolCollector(pool, "api"), process.NewPoolCollector(adminPool, "api_admin"))...)
	if err != nil {
		return err
	}

	public := http.NewServeMux()
	ordersH := httpjson.RefuseBrowserForms(ordersSvc.Handler())
	public.Handle("/orders", ordersH)
	public.Handle("/orders/", ordersH)
	process.Health(public, logger, process.PingReady(pool))
	// The description of every route, for clients' generators: public, as
	// it holds no secret.
	public.Handle("GET /openapi.yaml", describe())

	// The admin surface: on API_ADDR unless ADMIN_ADDR gives it a listener
	// of its own, which can then stay on a private network.
	adminMux := public
	if cfg.adminAddr != "" {
		adminMux = http.NewServeMux()
		// The ops page links to it, on its own listener.
		adminMux.Handle("GET /openapi.yaml", describe())
	}
	opsOpts := ops.Options{Admin: adminSvc, Token: cfg.adminToken, Logger: logger, Warnings: slices.Concat(cfg.misspelt, cfg.warnings()),
		Pool: adminPool, CookieSecure: cfg.opsCookieSecure, Lookups: []ops.Lookup{orderLookup(ordersSvc)},
		UserAgent: process.UserAgent()}
	// River UI counts River's jobs in the background: only when someone
	// can sign in to look at it.
	if cfg.adminToken != "" {
		riverUI, stopRiverUI, err := newRiverUI(ctx, adminPool, logger)
		if err != nil {
			return err
		}
		defer stopRiverUI()
		opsOpts.Jobs = riverUI
	}
	opsH := ops.New(opsOpts)
	// The admin API's token is checked as the ops page's bearer logins are,
	// under the same throttle.
	adminH := opsH.RequireToken(httpjson.RefuseBrowserForms(adminSvc.Handler()))
	adminMux.Handle("/webhook-endpoints", adminH)
	adminMux.Handle("/webhook-endpoints/", adminH)
	adminMux.Handle("/outbox/", adminH)
	adminMux.Handle("/event-types", adminH)
	adminMux.Handle("/ops", opsH)
	adminMux.Handle("/ops/", opsH)
	metricsH := process.MetricsHandler(reg)
	if cfg.adminAddr == "" {
		// On the listener the orders API shares, /metrics is behind the
		// admin token like the rest of the admin surface: it tells anyone
		// who can place an order the backlog, the endpoints' states, and
		// how often each admin route and login answered what. Prometheus
		// sends the token (authorization: credentials_file); ADMIN_ADDR's
		// listener, on a private network, serves it without.
		metricsH = opsH.RequireToken(metricsH)
	}
	adminMux.Handle("GET /metrics", metricsH)

	switch {
	case cfg.adminToken == "":
		logger.WarnContext(ctx, "ADMIN_TOKEN is not set: admin routes answer 403")
	case len(cfg.adminToken) < minAdminToken:
		logger.WarnContext(ctx, fmt.Sprintf("ADMIN_TOKEN is shorter than %d characters: accepted only because the admin routes listen on loopback; never expose this listener", minAdminToken),
			slog.String("addr", cfg.adminListener()))
	}

	for _, w := range cfg.warnings() {
		logger.WarnContext(ctx, w)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return process.Serve(gctx, logger, "api", cfg.addr, tracing.Handler(edge(public, httpMetrics, cfg.allowedHosts)), 10*time.Second, nil)
	})
	if cfg.adminAddr != "" {
		g.Go(func() error {
			return process.Serve(gctx, logger, "admin", cfg.adminAddr, tracing.Handler(edge(adminMux, httpMetrics, cfg.allowedHosts)), 10*time.Second, nil)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	logger.InfoContext(context.WithoutCancel(ctx), "api stopped")
	return nil
}

// edge is what every request to a listener passes first. A request for a
// host the api does not answer to (a DNS rebinding's) is refused before
// anything else: to the browser that sends it, it is same-origin, so
// nothing after this check would tell it apart. Cross-origin browser
// requests that change state are refused before any route sees them: the
// JSON routes have no other defence against a page on another site, and
// the ops page's forms are same-origin. Errors the router itself writes
// (404, 405) become problem details like every other error.
func edge(mux *http.ServeMux, metrics *process.HTTPMetrics, hosts process.Hosts) http.Handler {
	cop := http.NewCrossOriginProtection()
	// Measured outermost, refusals included; the route is the pattern the
	// mux matched (unmatched for a refusal before routing).
	return metrics.Wrap(process.CheckHost(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := cop.Check(r); err != nil {
			httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusForbidden,
				"cross-origin request refused (%v): state-changing requests must come from this origin or from a client that is not a browser", err))
			return
		}
		mux.ServeHTTP(&routerErrorWriter{ResponseWriter: w, r: r}, r)
	}), "API_ALLOWED_HOSTS", hosts))
}

// routerErrorWriter turns the plain-text 404 and 405 that http.ServeMux
// writes (through http.Error, hence text/plain) into problem details. The
// handlers' own errors are already problem+json or HTML and pass untouched.
type routerErrorWriter struct {
	http.ResponseWriter
	r        *http.Request
	replaced bool
}

func (w *routerErrorWriter) WriteHeader(code int) {
	if w.replaced {
		return
	}
	h := w.Header()
	if (code == http.StatusNotFound || code == http.StatusMethodNotAllowed) &&
		strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		w.replaced = true
		p := httpjson.NewProblem(http.StatusNotFound, "no route for %s %s", w.r.Method, w.r.URL.Path)
		if code == http.StatusMethodNotAllowed {
			p = httpjson.NewProblem(code, "method %s is not allowed on %s (allowed: %s)", w.r.Method, w.r.URL.Path, h.Get("Allow"))
		}
		httpjson.WriteProblem(w.ResponseWriter, p)
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *routerErrorWriter) Write(b []byte) (int, error) {
	if w.replaced {
		// The router's text body, dropped for the problem already written.
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *routerErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// orderLookup makes order ids searchable on the ops page: an order's
// events, whenever they were written, are those of its key.
func orderLookup(svc *orders.Service) ops.Lookup {
	return func(ctx context.Context, q string) (ops.Found, bool, error) {
		id, err := uuid.Parse(q)
		if err != nil {
			return ops.Found{}, false, nil
		}
		key, err := svc.EventKey(ctx, id)
		if errors.Is(err, orders.ErrNotFound) {
			return ops.Found{}, false, nil
		}
		if err != nil {
			return ops.Found{}, false, err
		}
		return ops.Found{Key: key}, true, nil
	}
}

// describe serves openapi/openapi.yaml, the description of every route.
func describe() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", openapi.MediaType)
		_, _ = w.Write(openapi.Description)
	})
}
