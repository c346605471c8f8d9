package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// options are the workshop's knobs; zero means the lab's default.
type options struct {
	N       int // orders or messages
	History int // lab 8: delivered rows of history
	Window  time.Duration
	Seed    uint64 // 0: random
	Verbose bool
}

// lab is one lab's world: its own fresh database (cloned from the migrated
// template, dropped at the end), its logger, its progress display, and what
// to clean up.
type lab struct {
	ctx     context.Context
	opts    options
	url     string
	pool    *pgxpool.Pool
	logger  *slog.Logger
	p       *progress
	rng     *rand.Rand
	cleanup []func()
}

func newLab(ctx context.Context, opts options, p *progress, logw io.Writer) (*lab, error) {
	p.Step("creating a fresh database for this lab")
	url, drop, err := dbtest.Create(ctx)
	if err != nil {
		return nil, fmt.Errorf("creating the lab's database (is PostgreSQL running on %s? see README): %w", dbtest.ServerURL(), err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		_ = drop()
		return nil, fmt.Errorf("opening the lab's database: %w", err)
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	l := &lab{ctx: ctx, opts: opts, url: url, pool: pool, p: p,
		logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	l.defer_(func() {
		if err := drop(); err != nil {
			fmt.Fprintf(os.Stderr, "workshop: dropping the lab's database: %v\n", err)
		}
	})
	l.defer_(pool.Close)
	return l, nil
}

// defer_ registers a cleanup; they run in reverse order.
func (l *lab) defer_(f func()) { l.cleanup = append(l.cleanup, f) }

func (l *lab) close() {
	for i := len(l.cleanup) - 1; i >= 0; i-- {
		l.cleanup[i]()
	}
}

func (l *lab) size(def int) int {
	if l.opts.N > 0 {
		return l.opts.N
	}
	return def
}

// pick returns k distinct numbers from [0, n), at least one when k > 0.
func (l *lab) pick(n int, rate float64) map[int]bool {
	k := max(1, int(float64(n)*rate+0.5))
	set := map[int]bool{}
	for _, i := range l.rng.Perm(n)[:min(k, n)] {
		set[i] = true
	}
	return set
}

// server is a real HTTP server on 127.0.0.1 whose handler can be set after
// its URL is known (an endpoint's secret exists only once it is registered).
type server struct {
	URL     string
	handler atomic.Pointer[http.Handler]
	srv     *http.Server
}

func (l *lab) serve(h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	s := &server{URL: "http://" + ln.Addr().String()}
	if h != nil {
		s.handler.Store(&h)
	}
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := s.handler.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})}
	go func() { _ = s.srv.Serve(ln) }()
	l.defer_(func() { _ = s.srv.Close() })
	return s, nil
}

func (s *server) Handle(h http.Handler) { s.handler.Store(&h) }

// receiver is a plain webhook receiver that counts deliveries by webhook-id
// and answers what respond says (204 when respond is nil).
type receiver struct {
	mu       sync.Mutex
	received map[string]int // webhook-id → 2xx answers
	requests int
	respond  func(r *http.Request, body []byte) int
}

func newReceiver() *receiver { return &receiver{received: map[string]int{}} }

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	rc.mu.Lock()
	rc.requests++
	respond := rc.respond
	rc.mu.Unlock()
	status := http.StatusNoContent
	if respond != nil {
		status = respond(r, body)
	}
	if status >= 200 && status < 300 {
		rc.mu.Lock()
		rc.received[r.Header.Get(webhook.HeaderID)]++
		rc.mu.Unlock()
	}
	w.WriteHeader(status)
}

// counts returns accepted deliveries, distinct webhook-ids, and requests.
func (rc *receiver) counts() (deliveries, unique, requests int64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, n := range rc.received {
		deliveries += int64(n)
	}
	return deliveries, int64(len(rc.received)), int64(rc.requests)
}

func (rc *receiver) reset() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.received, rc.requests = map[string]int{}, 0
}

// admin is the outbox's admin service, allowing receivers on loopback.
func (l *lab) admin() *admin.Service {
	return admin.New(l.pool, netguard.Guard{AllowPrivate: true}, l.logger)
}

// endpoint registers url for eventTypes and returns the endpoint.
func (l *lab) endpoint(url string, eventTypes ...string) (admin.Endpoint, error) {
	return l.admin().CreateEndpoint(l.ctx, url, eventTypes)
}

// labRelayConfig is the relay's configuration for labs: the product's
// relay at its defaults, with retries in milliseconds instead of the
// default schedule's minutes to hours, and a one-second delivery timeout.
func labRelayConfig() relay.Config {
	return relay.Config{
		MaxAttempts:     5,
		BackoffBase:     20 * time.Millisecond,
		BackoffMax:      200 * time.Millisecond,
		DeliveryTimeout: time.Second,
	}
}

func httpTransport() relay.Transport {
	return &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}
}

// startRelay runs a real outbox relay in this process, as cmd/worker does,
// until stop is called or the lab ends.
func (l *lab) startRelay(cfg relay.Config, transport relay.Transport) (stop func(), err error) {
	stopRelay, err := runRelay(l.ctx, l.pool, cfg, transport, l.logger)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	stop = func() { once.Do(stopRelay) }
	l.defer_(stop)
	return stop, nil
}

// runRelay starts the relay (its River client, dispatch and heartbeat) and
// returns what stops it, as a worker stops at SIGTERM.
func runRelay(ctx context.Context, pool *pgxpool.Pool, cfg relay.Config, transport relay.Transport, logger *slog.Logger) (stop func(), err error) {
	if transport == nil {
		transport = httpTransport()
	}
	relay, err := relay.New(pool, cfg, transport, logger, nil)
	if err != nil {
		return nil, err
	}
	if err := relay.Start(ctx); err != nil {
		return nil, fmt.Errorf("starting relay: %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = relay.Stop(ctx)
	}, nil
}

// waitFor polls cond until it holds, showing status, or fails after limit.
func (l *lab) waitFor(limit time.Duration, what string, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, status, err := cond()
		if err != nil {
			return err
		}
		if status != "" {
			l.p.Status("%s", status)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s waiting for %s (last: %s)", limit, what, status)
		}
		select {
		case <-l.ctx.Done():
			return l.ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// count runs a count(*) style query.
func (l *lab) count(sql string, args ...any) (int64, error) {
	var n int64
	if err := l.pool.QueryRow(l.ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting (%s): %w", sql, err)
	}
	return n, nil
}

// stats are the outbox's counts by status.
func (l *lab) stats() (admin.Stats, error) { return l.admin().Stats(l.ctx) }

// ---- child processes ----
//
// Some labs need a process to die for real: the workshop runs a copy of
// itself as a child (the environment variable below says which role), and
// that child kills itself with SIGKILL at the chosen moment. The parent
// reads the child's progress lines from its stdout.

const childEnv = "OUTBOXKIT_WORKSHOP_CHILD"

// spawn runs the child role with spec and calls onLine for each line it
// prints. killed reports that it died by a signal (as designed).
func (l *lab) spawn(role string, spec any, onLine func(string)) (killed bool, err error) {
	exe, err := os.Executable()
	if err != nil {
		return false, fmt.Errorf("finding the workshop binary: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(l.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+role, childEnv+"_SPEC="+string(b))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("starting the %s process: %w", role, err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		onLine(sc.Text())
	}
	err = cmd.Wait()
	if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == -1 && ctx.Err() == nil {
		return true, nil // terminated by a signal: its own SIGKILL
	}
	if err != nil {
		return false, fmt.Errorf("the %s process failed: %w", role, err)
	}
	return false, nil
}

// die is how a child process crashes: SIGKILL, no deferred functions, no
// graceful anything, exactly as the kernel's OOM killer or a power cut.
func die() {
	p, _ := os.FindProcess(os.Getpid())
	_ = p.Kill()
	select {}
}

// childMain runs a child role and returns the exit code.
func childMain(role string) int {
	ctx := context.Background()
	spec := []byte(os.Getenv(childEnv + "_SPEC"))
	var err error
	switch role {
	case "writer":
		err = runWriterChild(ctx, spec)
	case "relay":
		err = runRelayChild(ctx, spec)
	default:
		err = fmt.Errorf("unknown child role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "workshop child:", err)
		return 1
	}
	return 0
}

var errInvariant = errors.New("unexpected result")
