package relayworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/proctest"
	"github.com/outboxkit/orders/internal/relayworker"

	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/events/eventstest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/webhook"
)

// closedDB is a well-formed URL nobody listens on: with it, a config error
// and a connection error are told apart by the message.
const closedDB = "postgres://x@127.0.0.1:1/db"

const adminToken = "secret-token"

var client = &http.Client{Timeout: 10 * time.Second}

// get returns the status and body of GET url, or 0 when nothing answers.
func get(url string) (int, string) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// proc is a running program: the worker in-process, or the api as a child.
type proc struct {
	url  string
	logs *proctest.Output
	// client sends the tests' requests: the api's are checked against
	// its description (contracttest).
	client *http.Client
	done   chan error
	// signal asks the program to stop, as SIGTERM does.
	signal func()

	stopOnce sync.Once
	stopErr  error
}

// stop signals the program and returns its result; it reports an error of
// its own if the program has not returned within 20 s.
func (p *proc) stop() error {
	p.stopOnce.Do(func() {
		p.signal()
		select {
		case p.stopErr = <-p.done:
		case <-time.After(20 * time.Second):
			p.stopErr = errors.New("did not stop within 20s")
		}
	})
	return p.stopErr
}

// waitReady waits until /readyz answers 200, failing at once if the program
// exits instead.
func (p *proc) waitReady(t *testing.T) {
	t.Helper()
	var exited error
	require.Eventually(t, func() bool {
		select {
		case err := <-p.done:
			exited = fmt.Errorf("exited before becoming ready: %v", err)
			p.done <- err
			return true
		default:
		}
		code, _ := get(p.url + "/readyz")
		return code == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond, "never became ready")
	require.NoError(t, exited, "logs:\n%s", p.logs.String())
}

// startWorker runs the worker in-process with env plus a free WORKER_ADDR and
// JSON logs, and waits until it is ready.
func startWorker(t *testing.T, env map[string]string) *proc {
	t.Helper()
	full := map[string]string{"WORKER_ADDR": proctest.FreeAddr(t), "LOG_FORMAT": "json"}
	for k, v := range env {
		full[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{url: "http://" + full["WORKER_ADDR"], logs: &proctest.Output{}, client: client, done: make(chan error, 1), signal: cancel}
	go func() { p.done <- relayworker.Run(ctx, nil, proctest.Environ(full), p.logs) }()
	t.Cleanup(func() { _ = p.stop() })
	p.waitReady(t)
	return p
}

// startAPI runs the api in-process with env plus a free API_ADDR and JSON
// logs, and waits until it is ready.
func startAPI(t *testing.T, env map[string]string) *proc {
	t.Helper()
	full := map[string]string{"API_ADDR": proctest.FreeAddr(t), "LOG_FORMAT": "json"}
	for k, v := range env {
		full[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{url: "http://" + full["API_ADDR"], logs: &proctest.Output{}, client: contracttest.Client(t, client),
		done: make(chan error, 1), signal: cancel}
	go func() { p.done <- apiserver.Run(ctx, nil, proctest.Environ(full), p.logs) }()
	t.Cleanup(func() { _ = p.stop() })
	p.waitReady(t)
	return p
}

// admin sends an authenticated admin request and decodes a JSON answer into
// out (when not nil), returning the status.
func (p *proc) admin(t *testing.T, method, path, body string, out any) int {
	t.Helper()
	code, err := p.tryAdmin(method, path, body, out)
	require.NoError(t, err)
	return code
}

// tryAdmin is admin without a *testing.T, for require.Eventually conditions,
// which run on another goroutine.
func (p *proc) tryAdmin(method, path, body string, out any) (int, error) {
	code, b, err := send(p.client, p.url, method, path, "Bearer "+adminToken, body)
	if err != nil {
		return 0, err
	}
	if out != nil && code < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return code, fmt.Errorf("decoding %s: %w", b, err)
		}
	}
	return code, nil
}

func (p *proc) call(t *testing.T, method, path, authz, body string) (int, []byte) {
	t.Helper()
	code, b, err := send(p.client, p.url, method, path, authz, body)
	require.NoError(t, err)
	return code, b
}

// send is call without a *testing.T, for use from other goroutines.
func send(client *http.Client, base, method, path, authz, body string) (int, []byte, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		return 0, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// receiver is a webhook endpoint that verifies every delivery's Standard
// Webhooks signature and records what it accepted.
type receiver struct {
	*httptest.Server

	mu        sync.Mutex
	verifier  *webhook.Verifier
	status    int
	attempts  map[string]int // by webhook-id, every signed request
	delivered map[string]delivery
	badSigs   []string
}

type delivery struct {
	header http.Header
	body   []byte
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rec := &receiver{status: http.StatusNoContent, attempts: map[string]int{}, delivered: map[string]delivery{}}
	rec.Server = httptest.NewServer(http.HandlerFunc(rec.serve))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.verifier == nil {
		rec.badSigs = append(rec.badSigs, "delivery before the secret was known")
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if err := rec.verifier.Verify(r.Header, body); err != nil {
		rec.badSigs = append(rec.badSigs, err.Error())
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	id := r.Header.Get(webhook.HeaderID)
	rec.attempts[id]++
	if rec.status >= 200 && rec.status < 300 {
		if _, dup := rec.delivered[id]; !dup {
			rec.delivered[id] = delivery{header: r.Header.Clone(), body: body}
		}
	}
	w.WriteHeader(rec.status)
	_, _ = io.WriteString(w, http.StatusText(rec.status))
}

func (rec *receiver) setSecret(t *testing.T, secret string) {
	t.Helper()
	v, err := webhook.NewVerifier(secret)
	require.NoError(t, err)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.verifier = v
}

func (rec *receiver) setStatus(code int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.status = code
}

func (rec *receiver) snapshot() (map[string]delivery, map[string]int, []string) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	d := make(map[string]delivery, len(rec.delivered))
	for k, v := range rec.delivered {
		d[k] = v
	}
	a := make(map[string]int, len(rec.attempts))
	for k, v := range rec.attempts {
		a[k] = v
	}
	return d, a, append([]string(nil), rec.badSigs...)
}

// register registers rec for eventTypes on the api and teaches rec the secret.
func register(t *testing.T, api *proc, rec *receiver, eventTypes ...string) {
	t.Helper()
	types, err := json.Marshal(eventTypes)
	require.NoError(t, err)
	var ep struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	code := api.admin(t, http.MethodPost, "/webhook-endpoints",
		`{"url":"`+rec.URL+`/hooks","event_types":`+string(types)+`}`, &ep)
	require.Equal(t, http.StatusCreated, code)
	require.True(t, strings.HasPrefix(ep.Secret, webhook.SecretPrefix))
	rec.setSecret(t, ep.Secret)
	t.Cleanup(func() {
		require.NotContains(t, api.logs.String(), ep.Secret, "api logged the endpoint secret")
	})
}

type stats struct {
	Pending, Claimed, Delivered, Failed int64
	OldestPendingAgeSeconds             float64 `json:"oldest_pending_age_seconds"`
}

func (p *proc) stats(t *testing.T) stats {
	t.Helper()
	var s stats
	require.Equal(t, http.StatusOK, p.admin(t, http.MethodGet, "/outbox/stats", "", &s))
	return s
}

// relayEnv is a worker configuration that reacts fast enough for tests.
func relayEnv(dbURL string) map[string]string {
	return map[string]string{
		"DATABASE_URL":                 dbURL,
		"OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
		"OUTBOX_POLL_INTERVAL":         "50ms",
		"OUTBOX_BACKOFF_BASE":          "10ms",
		"OUTBOX_BACKOFF_MAX":           "50ms",
	}
}

// setup starts the api and a worker on one fresh database, and a receiver.
func setup(t *testing.T, workerEnv map[string]string) (api, worker *proc, rec *receiver) {
	t.Helper()
	dbURL := dbtest.URL(t)
	eventstest.CheckEvents(t, dbURL)
	rec = newReceiver(t)
	api = startAPI(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	env := relayEnv(dbURL)
	for k, v := range workerEnv {
		env[k] = v
	}
	worker = startWorker(t, env)
	return api, worker, rec
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"poll interval not a duration", map[string]string{"OUTBOX_POLL_INTERVAL": "fast"}, []string{"OUTBOX_POLL_INTERVAL"}},
		{"negative batch size", map[string]string{"OUTBOX_BATCH_SIZE": "-1"}, []string{"OUTBOX_BATCH_SIZE"}},
		{"zero batch size", map[string]string{"OUTBOX_BATCH_SIZE": "0"}, []string{"OUTBOX_BATCH_SIZE"}},
		{"max attempts not a number", map[string]string{"OUTBOX_MAX_ATTEMPTS": "abc"}, []string{"OUTBOX_MAX_ATTEMPTS"}},
		{"negative backoff base", map[string]string{"OUTBOX_BACKOFF_BASE": "-1s"}, []string{"OUTBOX_BACKOFF_BASE"}},
		{"delivery timeout without unit", map[string]string{"OUTBOX_DELIVERY_TIMEOUT": "10"}, []string{"OUTBOX_DELIVERY_TIMEOUT"}},
		{"retention not a duration", map[string]string{"OUTBOX_RETENTION": "x"}, []string{"OUTBOX_RETENTION"}},
		{"zero prune interval", map[string]string{"OUTBOX_PRUNE_INTERVAL": "0s"}, []string{"OUTBOX_PRUNE_INTERVAL"}},
		{"claim timeout within a request", map[string]string{"OUTBOX_CLAIM_TIMEOUT": "1s"}, []string{"OUTBOX_CLAIM_TIMEOUT"}},
		{"retry schedule entry not a duration", map[string]string{"OUTBOX_RETRY_SCHEDULE": "5s,soon"}, []string{"OUTBOX_RETRY_SCHEDULE"}},
		{"schedule and exponential backoff at once", map[string]string{"OUTBOX_RETRY_SCHEDULE": "5s,1m", "OUTBOX_BACKOFF_BASE": "1s"},
			[]string{"OUTBOX_BACKOFF_BASE"}},
		{"relay timeout under a second", map[string]string{"OUTBOX_RELAY_TIMEOUT": "500ms"}, []string{"OUTBOX_RELAY_TIMEOUT"}},
		{"zero destination concurrency", map[string]string{"OUTBOX_DESTINATION_CONCURRENCY": "0"}, []string{"OUTBOX_DESTINATION_CONCURRENCY"}},
		{"circuit threshold not a number", map[string]string{"OUTBOX_CIRCUIT_THRESHOLD": "five"}, []string{"OUTBOX_CIRCUIT_THRESHOLD"}},
		{"backoff max below base", map[string]string{"OUTBOX_BACKOFF_BASE": "1m", "OUTBOX_BACKOFF_MAX": "1s"}, []string{"OUTBOX_BACKOFF_MAX"}},
		// River's own bounds, and values a typo makes, refused before the
		// database is touched (they failed after migrating, or ran the
		// worker out of memory at its first delivery).
		{"poll interval below River's fetch cooldown", map[string]string{"OUTBOX_POLL_INTERVAL": "5ms"}, []string{"OUTBOX_POLL_INTERVAL"}},
		{"more deliver workers than River runs", map[string]string{"OUTBOX_DELIVER_WORKERS": "20000"}, []string{"OUTBOX_DELIVER_WORKERS"}},
		{"destination concurrency in the billions", map[string]string{"OUTBOX_DESTINATION_CONCURRENCY": "2000000000"},
			[]string{"OUTBOX_DESTINATION_CONCURRENCY"}},
		{"batch size in the millions", map[string]string{"OUTBOX_BATCH_SIZE": "5000000"}, []string{"OUTBOX_BATCH_SIZE"}},
		{"delivery timeout whose sum overflows", map[string]string{"OUTBOX_DELIVERY_TIMEOUT": "2562047h47m10s"},
			[]string{"OUTBOX_DELIVERY_TIMEOUT"}},
		{"listen address without a port", map[string]string{"WORKER_ADDR": "nonsense"}, []string{"WORKER_ADDR"}},
		{"listen port out of range", map[string]string{"WORKER_ADDR": "127.0.0.1:99999"}, []string{"WORKER_ADDR"}},
		{"malformed database url", map[string]string{"DATABASE_URL": "postgres://%zz"}, []string{"DATABASE_URL"}},
		// A production process never guesses a database (cmd/dev does).
		{"no database url", map[string]string{"DATABASE_URL": ""}, []string{"DATABASE_URL: required"}},
		{"log format", map[string]string{"LOG_FORMAT": "xml"}, []string{"LOG_FORMAT"}},
		{"allow private targets", map[string]string{"OUTBOX_ALLOW_PRIVATE_TARGETS": "maybe"}, []string{"OUTBOX_ALLOW_PRIVATE_TARGETS"}},
		{"every problem at once", map[string]string{"OUTBOX_POLL_INTERVAL": "fast", "OUTBOX_MAX_ATTEMPTS": "abc", "OUTBOX_RETENTION": "x"},
			[]string{"OUTBOX_POLL_INTERVAL", "OUTBOX_MAX_ATTEMPTS", "OUTBOX_RETENTION"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": closedDB, "WORKER_ADDR": "127.0.0.1:0"}
			for k, v := range tc.env {
				env[k] = v
			}
			var out proctest.Output
			err := relayworker.Run(context.Background(), nil, proctest.Environ(env), &out)
			require.Error(t, err)
			require.ErrorContains(t, err, "invalid configuration")
			for _, name := range tc.want {
				require.ErrorContains(t, err, name)
			}
			require.NotContains(t, err.Error(), "connecting to database")
			require.Empty(t, out.String(), "nothing should happen before the configuration is valid")
		})
	}

	// The control: valid settings with the same unreachable database fail
	// differently, so the rows above did fail on configuration.
	t.Run("valid config reaches the database", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"DATABASE_URL": closedDB, "WORKER_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json"}
		err := relayworker.Run(context.Background(), nil, proctest.Environ(env), io.Discard)
		require.ErrorContains(t, err, "connecting to database")
		require.NotContains(t, err.Error(), "invalid configuration")
	})

	t.Run("arguments", func(t *testing.T) {
		t.Parallel()
		err := relayworker.Run(context.Background(), []string{"migrate"}, proctest.Environ(map[string]string{"DATABASE_URL": closedDB}), io.Discard)
		require.ErrorContains(t, err, "unexpected arguments")
	})

	// A setting that is no longer read is said, not silently ignored, and
	// does not stop the worker.
	t.Run("retired settings", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"DATABASE_URL": closedDB, "WORKER_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json",
			"OUTBOX_DELIVER_CONCURRENCY": "16", "OUTBOX_MAX_IN_FLIGHT": "5000"}
		var out proctest.Output
		err := relayworker.Run(context.Background(), nil, proctest.Environ(env), &out)
		require.ErrorContains(t, err, "connecting to database")
		require.Contains(t, out.String(), "OUTBOX_DELIVER_CONCURRENCY is no longer read: use OUTBOX_DESTINATION_CONCURRENCY")
		require.Contains(t, out.String(), "OUTBOX_MAX_IN_FLIGHT is no longer read")
	})

	// A misspelt setting is named with the one meant, and does not stop the
	// worker; the api's settings, in an environment both share, are not
	// taken for misspellings.
	t.Run("misspelt settings", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"DATABASE_URL": closedDB, "WORKER_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json",
			"OUTBOX_MAX_ATTEMPT": "20", "OUTBOX_DELIVERY_TIMOUT": "30s",
			"API_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0", "OPS_COOKIE_SECURE": "true", "ADMIN_TOKEN": "t"}
		var out proctest.Output
		err := relayworker.Run(context.Background(), nil, proctest.Environ(env), &out)
		require.ErrorContains(t, err, "connecting to database")
		proctest.RequireMisspelt(t, out.String(),
			"OUTBOX_MAX_ATTEMPT is set but nothing reads it: did you mean OUTBOX_MAX_ATTEMPTS?",
			"OUTBOX_DELIVERY_TIMOUT is set but nothing reads it: did you mean OUTBOX_DELIVERY_TIMEOUT?")
	})
}

// envelope is the webhook body.
type envelope struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	CreatedAt string          `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	api, worker, rec := setup(t, nil)
	register(t, api, rec, "order.placed", "order.cancelled")

	// Place 20 orders at once.
	const n = 20
	type placed struct {
		code int
		body []byte
		err  error
	}
	results := make([]placed, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			code, body, err := send(api.client, api.url, http.MethodPost, "/orders", "",
				`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":2,"unit_price_cents":500}]}`)
			results[i] = placed{code, body, err}
		})
	}
	wg.Wait()
	orders := map[string]string{} // order id → order JSON as POST returned it
	for _, r := range results {
		require.NoError(t, r.err)
		require.Equal(t, http.StatusCreated, r.code, "body: %s", r.body)
		var o struct {
			ID         string `json:"id"`
			Status     string `json:"status"`
			TotalCents int64  `json:"total_cents"`
		}
		require.NoError(t, json.Unmarshal(r.body, &o))
		require.Equal(t, "placed", o.Status)
		require.EqualValues(t, 1000, o.TotalCents)
		orders[o.ID] = string(r.body)
	}
	require.Len(t, orders, n)

	var cancelledID string
	for id := range orders {
		cancelledID = id
		break
	}
	code, cancelled := api.call(t, http.MethodPost, "/orders/"+cancelledID+"/cancel", "", "")
	require.Equal(t, http.StatusOK, code, "body: %s", cancelled)
	require.Contains(t, string(cancelled), `"status":"cancelled"`)

	require.Eventually(t, func() bool {
		delivered, _, bad := rec.snapshot()
		return len(delivered) == n+1 || len(bad) > 0
	}, 30*time.Second, 20*time.Millisecond, "the receiver never got every event")

	delivered, _, bad := rec.snapshot()
	require.Empty(t, bad, "the receiver saw bad signatures")
	require.Len(t, delivered, n+1)
	placedFor := map[string]bool{}
	var cancelledEvents int
	for id, d := range delivered {
		require.Equal(t, "application/json", d.header.Get("Content-Type"))
		require.Equal(t, process.UserAgent(), d.header.Get("User-Agent"),
			"the worker names itself after its module, never after the template a copy came from")
		var env envelope
		require.NoError(t, json.Unmarshal(d.body, &env), "body: %s", d.body)
		var fields map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(d.body, &fields))
		require.Len(t, fields, 4, "body has exactly id, type, created_at and data: %s", d.body)
		require.Equal(t, id, env.ID, "body id is the webhook-id")
		_, err := time.Parse(time.RFC3339Nano, env.CreatedAt)
		require.NoError(t, err)

		var data struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal(env.Data, &data))
		switch env.Type {
		case "order.placed":
			want, ok := orders[data.ID]
			require.True(t, ok, "order.placed for an unknown order %s", data.ID)
			require.False(t, placedFor[data.ID], "two messages placed order %s", data.ID)
			placedFor[data.ID] = true
			require.JSONEq(t, want, string(env.Data))
		case "order.cancelled":
			cancelledEvents++
			require.Equal(t, cancelledID, data.ID)
			require.JSONEq(t, string(cancelled), string(env.Data))
		default:
			t.Fatalf("unexpected event type %q", env.Type)
		}
	}
	require.Len(t, placedFor, n)
	require.Equal(t, 1, cancelledEvents)

	// The receiver answers before the relay records: wait for the records.
	require.Eventually(t, func() bool {
		var s stats
		code, err := api.tryAdmin(http.MethodGet, "/outbox/stats", "", &s)
		return err == nil && code == http.StatusOK && s.Delivered == n+1
	}, 10*time.Second, 20*time.Millisecond)
	s := api.stats(t)
	require.Equal(t, stats{Delivered: n + 1}, s)

	code, _ = get(worker.url + "/readyz")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(worker.url + "/healthz")
	require.Equal(t, http.StatusOK, code)
	code, metrics := get(worker.url + "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, "outbox_deliveries_total")
	require.Contains(t, metrics, `outbox_deliveries_total{outcome="delivered"}`)
	require.Contains(t, metrics, "outbox_deliver_jobs_total")
	require.Contains(t, metrics, `outbox_destinations{state="healthy"} 1`)
	require.Contains(t, metrics, "outbox_relays 1")
	require.Contains(t, metrics, "outbox_messages")
	// The worker's own server is measured as the api's is: the /readyz
	// above, by route pattern; and its pool reports its connections.
	require.Regexp(t, `http_requests_total\{code="200",method="GET",route="GET /readyz"\} [1-9]`, metrics)
	require.Contains(t, metrics, `pgxpool_connections{pool="worker",state="idle"}`)

	// SIGTERM to both: each stops gracefully, in time, without error.
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = api.stop() })
	wg.Go(func() { errs[1] = worker.stop() })
	wg.Wait()
	require.NoError(t, errs[0], "api; logs:\n%s", api.logs.String())
	require.NoError(t, errs[1], "worker; logs:\n%s", worker.logs.String())
	proctest.RequireJSONLogs(t, worker.logs.String())
	proctest.RequireJSONLogs(t, api.logs.String())
}

type message struct {
	ID          string     `json:"id"`
	EventID     string     `json:"event_id"`
	Status      string     `json:"status"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error"`
	DeliveredAt *time.Time `json:"delivered_at"`
}

func TestFailedMessageRetried(t *testing.T) {
	t.Parallel()
	api, worker, rec := setup(t, map[string]string{"OUTBOX_MAX_ATTEMPTS": "2"})
	rec.setStatus(http.StatusInternalServerError)
	register(t, api, rec, "order.placed")

	code, body := api.call(t, http.MethodPost, "/orders", "",
		`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":2,"unit_price_cents":500}]}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)

	var failed []message
	require.Eventually(t, func() bool {
		code, err := api.tryAdmin(http.MethodGet, "/outbox/messages?status=failed", "", &failed)
		return err == nil && code == http.StatusOK && len(failed) > 0
	}, 30*time.Second, 20*time.Millisecond, "the message never failed")
	require.Len(t, failed, 1)
	msg := failed[0]
	require.Equal(t, "failed", msg.Status)
	require.Equal(t, 2, msg.Attempts)
	require.Contains(t, msg.LastError, "500")
	_, attempts, bad := rec.snapshot()
	require.Empty(t, bad)
	require.Equal(t, map[string]int{msg.EventID: 2}, attempts, "one request per attempt, all with the event id")
	require.Equal(t, stats{Failed: 1}, api.stats(t))

	rec.setStatus(http.StatusNoContent)
	var retried message
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodPost, "/outbox/messages/"+msg.ID+"/retry", "", &retried))
	require.Equal(t, "pending", retried.Status)

	require.Eventually(t, func() bool {
		var m message
		code, err := api.tryAdmin(http.MethodGet, "/outbox/messages/"+msg.ID, "", &m)
		return err == nil && code == http.StatusOK && m.Status == "delivered"
	}, 30*time.Second, 20*time.Millisecond, "the retried message was never delivered")
	delivered, attempts, bad := rec.snapshot()
	require.Empty(t, bad)
	require.Contains(t, delivered, msg.EventID, "the retry keeps the webhook-id")
	require.Equal(t, 3, attempts[msg.EventID])
	require.Equal(t, stats{Delivered: 1}, api.stats(t))

	require.Equal(t, http.StatusConflict, api.admin(t, http.MethodPost, "/outbox/messages/"+msg.ID+"/retry", "", nil),
		"only failed messages can be retried")
	require.NoError(t, worker.stop())
	require.NoError(t, api.stop())
}

// TestShutdownFinishesInFlightDelivery stops the worker while a webhook
// request is in flight: the request must be allowed to finish and its
// outcome recorded, not be cut off and left claimed until the claim timeout.
func TestShutdownFinishesInFlightDelivery(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
			w.WriteHeader(http.StatusNoContent)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(rec.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	_, err = adm.CreateEndpoint(ctx, rec.URL, []string{"test.event"})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "test.event", Data: map[string]int{"n": 1}})
		return err
	}))

	env := relayEnv(dbURL)
	env["WORKER_SHUTDOWN_GRACE"] = "10s"
	worker := startWorker(t, env)
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery never arrived")
	}

	stopped := make(chan error, 1)
	go func() { stopped <- worker.stop() }()
	// The worker's HTTP server closes first on shutdown; once it is gone
	// the shutdown is underway, and only then does the receiver answer.
	require.Eventually(t, func() bool {
		code, _ := get(worker.url + "/healthz")
		return code == 0
	}, 10*time.Second, 10*time.Millisecond)
	close(release)
	require.NoError(t, <-stopped, "logs:\n%s", worker.logs.String())

	s, err := adm.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.Stats{Delivered: 1}, s, "the in-flight delivery must be recorded before the worker exits; logs:\n%s", worker.logs.String())
}
