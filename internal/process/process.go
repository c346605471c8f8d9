// Package process holds what every process of this service does at its
// edges: parse the environment, set up logging, open the database pool, serve
// health and metrics, and shut down gracefully. The cmd/ mains only wire.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lmittmann/tint"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/term"

	"github.com/outboxkit/orders/db"
)

// Env reads configuration from a getenv function and collects every problem,
// each naming its variable, so a misconfigured process stops at once with
// the whole list.
type Env struct {
	getenv func(string) string
	errs   []error
	// read holds every name asked for, so that a variable set but never
	// read can be recognized as a misspelling of one that is (Misspelt).
	read map[string]bool
}

// NewEnv reads from getenv (Getenv(os.Environ()) in main, a map in tests).
func NewEnv(getenv func(string) string) *Env {
	e := &Env{read: map[string]bool{}}
	e.getenv = func(name string) string {
		e.read[name] = true
		return getenv(name)
	}
	return e
}

// Getenv looks names up in environ, a list of name=value as os.Environ
// returns it; the first of a repeated name wins, as with os.Getenv.
func Getenv(environ []string) func(string) string {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if _, seen := vars[name]; !seen {
			vars[name] = value
		}
	}
	return func(name string) string { return vars[name] }
}

// Misspelt returns a warning for each variable of environ that was never
// read but is within two edits (a letter added, dropped, changed or two
// swapped) of one that was: OUTBOX_MAX_ATTEMPT=20 would otherwise be ignored
// without a word. Call it once everything is read. Every variable the api
// and the worker read is at least three edits from every other (a test holds
// it), so a variable meant for the other process, in an environment both
// share, is never taken for a misspelling. OTEL_ variables are left out: the
// OpenTelemetry SDK reads many of its own.
func (e *Env) Misspelt(environ []string) []string {
	var warnings []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if value == "" || e.read[name] || strings.HasPrefix(name, "OTEL_") {
			continue
		}
		var near []string
		for known := range e.read {
			if editDistance(name, known) <= 2 {
				near = append(near, known)
			}
		}
		if len(near) > 0 {
			slices.Sort(near)
			warnings = append(warnings, fmt.Sprintf("%s is set but nothing reads it: did you mean %s?", name, strings.Join(near, " or ")))
		}
	}
	slices.Sort(warnings)
	return slices.Compact(warnings)
}

// editDistance is the optimal string alignment distance between a and b:
// the fewest insertions, deletions, substitutions and swaps of adjacent
// bytes that turn one into the other, each substring edited once.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// String returns the variable or def when unset.
func (e *Env) String(name, def string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return def
}

// Addr returns a listen address, host:port (the host may be empty, the port
// a number, 0 for any free one), or def when unset; "" when def is and the
// variable is unset. A listener's typo is refused with the other settings,
// before the process starts anything.
func (e *Env) Addr(name, def string) string {
	v := e.String(name, def)
	if v == "" {
		return ""
	}
	_, port, err := net.SplitHostPort(v)
	if err == nil {
		var n int
		n, err = strconv.Atoi(port)
		if err == nil && (n < 0 || n > 65535) {
			err = fmt.Errorf("port %d out of range", n)
		}
	}
	if err != nil {
		e.Fail(name, fmt.Errorf("want host:port, such as 127.0.0.1:8080, got %q: %w", v, err))
	}
	return v
}

// Duration parses a Go duration (such as 500ms or 2m); it must be positive.
func (e *Env) Duration(name string, def time.Duration) time.Duration {
	v := e.getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		e.errs = append(e.errs, fmt.Errorf("%s: want a positive Go duration such as 500ms or 2m, got %q", name, v))
		return def
	}
	return d
}

// Durations parses a comma-separated list of positive Go durations (such as
// 5s,5m,30m).
func (e *Env) Durations(name string, def []time.Duration) []time.Duration {
	v := e.getenv(name)
	if v == "" {
		return def
	}
	var out []time.Duration
	for _, part := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d <= 0 {
			e.errs = append(e.errs, fmt.Errorf("%s: want comma-separated positive Go durations such as 5s,5m,30m, got %q", name, v))
			return def
		}
		out = append(out, d)
	}
	return out
}

// Int parses a positive integer.
func (e *Env) Int(name string, def int) int {
	v := e.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		e.errs = append(e.errs, fmt.Errorf("%s: want a positive integer, got %q", name, v))
		return def
	}
	return n
}

// Bool parses true/false (and the forms strconv.ParseBool accepts).
func (e *Env) Bool(name string, def bool) bool {
	v := e.getenv(name)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s: want true or false, got %q", name, v))
		return def
	}
	return b
}

// OneOf returns the variable, which must be one of allowed, or def.
func (e *Env) OneOf(name, def string, allowed ...string) string {
	v := e.String(name, def)
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	e.errs = append(e.errs, fmt.Errorf("%s: want one of %q, got %q", name, allowed, v))
	return def
}

// DatabaseURL returns DATABASE_URL, which is required and must parse. A
// production process never guesses a database: only cmd/dev falls back to
// a local or throwaway one (OptionalDatabaseURL), and passes it on.
func (e *Env) DatabaseURL() string {
	if e.getenv("DATABASE_URL") == "" {
		e.errs = append(e.errs, errors.New("DATABASE_URL: required, a PostgreSQL URL such as postgres://user@host:5432/orders (go run ./cmd/dev starts a local database for development)"))
		return ""
	}
	return e.OptionalDatabaseURL()
}

// OptionalDatabaseURL returns DATABASE_URL, checked to parse, or "" when
// unset.
func (e *Env) OptionalDatabaseURL() string {
	v := e.getenv("DATABASE_URL")
	if v == "" {
		return ""
	}
	if _, err := pgxpool.ParseConfig(v); err != nil {
		e.errs = append(e.errs, fmt.Errorf("DATABASE_URL: not a valid PostgreSQL URL: %w", err))
	}
	return v
}

// Fail records a problem found while checking values together.
func (e *Env) Fail(name string, err error) { e.errs = append(e.errs, fmt.Errorf("%s: %w", name, err)) }

// Err returns every problem found, or nil.
func (e *Env) Err() error {
	if len(e.errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid configuration: %w", errors.Join(e.errs...))
}

// NewLogger returns a logger writing to w: tint's coloured text when format
// is "text", JSON when "json", and for "" text on a terminal, JSON otherwise.
func NewLogger(w io.Writer, format string) *slog.Logger {
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			format = "text"
		}
	}
	if format == "text" {
		colour := false
		if f, ok := w.(*os.File); ok {
			colour = term.IsTerminal(int(f.Fd()))
		}
		return slog.New(tint.NewHandler(w, &tint.Options{TimeFormat: time.TimeOnly, NoColor: !colour}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: durationAsText}))
}

// durationAsText writes durations as a person reads them ("50ms"), not as
// the nanoseconds JSON would otherwise carry.
func durationAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// OpenPool connects to PostgreSQL and checks the connection; configure
// functions adjust the pool's configuration first. maxConns is the pool's
// size unless the URL sets its own (pool_max_conns): the operator's word
// wins over the program's default.
func OpenPool(ctx context.Context, url string, maxConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	if maxConns > 0 && !setsPoolSize(url) {
		cfg.MaxConns = maxConns
	}
	db.ConfigurePool(cfg)
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("creating pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to database %s@%s/%s: %w", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// setsPoolSize reports whether the connection string (URL or key=value)
// sets pool_max_conns. pgxpool.Config cannot tell a size it was given from
// its default, but pgconn's parser keeps every setting it does not know,
// pool_max_conns among them, as a runtime parameter.
func setsPoolSize(url string) bool {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return false
	}
	_, ok := cfg.RuntimeParams["pool_max_conns"]
	return ok
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors and the given ones.
func NewRegistry(cs ...prometheus.Collector) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	return reg, nil
}

// Ops adds /healthz, /readyz (see Health) and /metrics (see Metrics) to mux.
func Ops(mux *http.ServeMux, logger *slog.Logger, reg *prometheus.Registry, ready func(context.Context) error) {
	Health(mux, logger, ready)
	Metrics(mux, reg)
}

// readyLogEvery bounds how often a readiness failure that persists is
// logged again: the first failure is logged at once, then at most this often,
// so a probe every second does not flood the log.
const readyLogEvery = time.Minute

// Health adds /healthz (the process is up) and /readyz (ready reports nil)
// to mux. A failing /readyz answers 503 "not ready" and nothing more: the
// port may be public, and the reason (a database error names its host, user
// and database) belongs in the log, where it goes when readiness is lost,
// again at most every readyLogEvery while it stays lost, and with a line
// when it comes back.
func Health(mux *http.ServeMux, logger *slog.Logger, ready func(context.Context) error) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	var (
		mu      sync.Mutex
		failing bool
		logged  time.Time
	)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		err := ready(ctx)
		mu.Lock()
		switch now := time.Now(); {
		case err != nil && (!failing || now.Sub(logged) >= readyLogEvery):
			logger.WarnContext(ctx, "not ready", slog.Any("error", err))
			failing, logged = true, now
		case err == nil && failing:
			logger.InfoContext(ctx, "ready again")
			failing = false
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready\n")
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
}

// Metrics adds /metrics, serving reg, to mux.
func Metrics(mux *http.ServeMux, reg *prometheus.Registry) {
	mux.Handle("GET /metrics", MetricsHandler(reg))
}

// MetricsHandler serves reg in Prometheus' text format, for a mux that
// puts it behind something (the api's admin token).
func MetricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// PingReady is a readiness check: the database answers.
func PingReady(pool *pgxpool.Pool) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("database unreachable: %w", err)
		}
		return nil
	}
}

// timeouts are a server's bounds on a request, each from its start.
type timeouts struct {
	header, body, handler, write time.Duration
}

// serverTimeouts are Serve's: the body must have arrived before the
// handler's deadline, and the handler's deadline passes before the write
// deadline, so a handler can still answer a body that stopped coming (408)
// or work that took too long (503); with all three at one time it could
// not.
var serverTimeouts = timeouts{header: 10 * time.Second, body: 20 * time.Second, handler: HandlerTimeout, write: HandlerTimeout + 5*time.Second}

func newServer(h http.Handler, logger *slog.Logger, t timeouts) *http.Server {
	return &http.Server{
		Handler:           WithDeadline(h, t.handler),
		ReadHeaderTimeout: t.header,
		ReadTimeout:       t.body,
		WriteTimeout:      t.write,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// HandlerTimeout bounds the work of one request: its context's deadline
// (WithDeadline), set by Serve a few seconds before the server's own write
// timeout. The write timeout alone only fails the final write: the handler
// would go on waiting for a slow database, commit, log success, and its
// client would get an empty reply for an order that was placed.
const HandlerTimeout = 25 * time.Second

// WithDeadline gives each request's context a deadline d from its start:
// a handler's statements are cancelled and its transaction rolled back
// when it passes, and httpjson.WriteError answers 503.
func WithDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// Serve listens on addr and serves h until ctx is done, then shuts down,
// giving in-flight requests up to grace to finish. Each request's context
// ends HandlerTimeout after it started. ready, if not nil,
// receives the bound address (useful with port 0 in tests).
func Serve(ctx context.Context, logger *slog.Logger, name, addr string, h http.Handler, grace time.Duration, ready chan<- string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := newServer(h, logger, serverTimeouts)
	logger.InfoContext(ctx, "listening", slog.String("server", name), slog.String("addr", ln.Addr().String()))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving %s: %w", name, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutting down %s: %w", name, err)
	}
	return nil
}
