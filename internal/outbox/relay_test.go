package outbox_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// receiver is a real webhook receiver: it verifies signatures and records
// every delivery, and answers with whatever respond says.
type receiver struct {
	t        testing.TB
	srv      *httptest.Server
	verifier *webhook.Verifier

	mu sync.Mutex
	// respond answers the n-th request for a webhook-id.
	respond   func(r *http.Request, n int) int
	received  map[string]int // webhook-id → deliveries accepted
	attempts  map[string]int // webhook-id → requests, whatever the answer
	bodies    map[string]envelope
	headers   map[string]http.Header
	badSigned int
	// arrived lists the webhook-ids of accepted deliveries in the order
	// they were accepted.
	arrived []string
}

type envelope struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

func newReceiver(t testing.TB) *receiver {
	rc := &receiver{t: t, received: map[string]int{}, attempts: map[string]int{}, bodies: map[string]envelope{}, headers: map[string]http.Header{},
		respond: func(*http.Request, int) int { return http.StatusNoContent }}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	if rc.verifier == nil || rc.verifier.Verify(r.Header, body) != nil {
		rc.badSigned++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	id := r.Header.Get(webhook.HeaderID)
	rc.attempts[id]++
	n := rc.attempts[id]
	respond := rc.respond
	rc.mu.Unlock()

	status := respond(r, n)
	rc.mu.Lock()
	if status >= 200 && status < 300 {
		rc.received[id]++
		rc.arrived = append(rc.arrived, id)
		var env envelope
		if err := json.Unmarshal(body, &env); err != nil {
			rc.t.Errorf("webhook body is not the envelope: %v", err)
		}
		rc.bodies[id] = env
		rc.headers[id] = r.Header.Clone()
	}
	rc.mu.Unlock()
	w.WriteHeader(status)
}

// failing makes rc answer status to every request while the returned flag
// is set (it starts set), and 204 once it is cleared: a receiver that is
// down until the test brings it back.
func (rc *receiver) failing(status int) *atomic.Bool {
	down := &atomic.Bool{}
	down.Store(true)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.respond = func(*http.Request, int) int {
		if down.Load() {
			return status
		}
		return http.StatusNoContent
	}
	return down
}

func (rc *receiver) setSecret(secret string) {
	v, err := webhook.NewVerifier(secret)
	require.NoError(rc.t, err)
	rc.mu.Lock()
	rc.verifier = v
	rc.mu.Unlock()
}

func (rc *receiver) count(id uuid.UUID) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.received[id.String()]
}

// arrivals is the webhook-ids of the accepted deliveries, in the order they
// were accepted.
func (rc *receiver) arrivals() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.arrived...)
}

func (rc *receiver) total() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.received)
}

type fixture struct {
	pool  *pgxpool.Pool
	admin *admin.Service
}

func setup(t *testing.T) fixture {
	t.Helper()
	pool := dbtest.Pool(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return fixture{pool: pool, admin: admin.New(pool, netguard.Guard{AllowPrivate: true}, logger)}
}

// endpoint registers rc for the given event types.
func (f fixture) endpoint(t *testing.T, rc *receiver, types ...string) admin.Endpoint {
	t.Helper()
	ep, err := f.admin.CreateEndpoint(context.Background(), rc.srv.URL+"/hook", types)
	require.NoError(t, err)
	rc.setSecret(ep.Secret)
	return ep
}

// enqueue commits one event and returns the ids of its messages (its
// deliveries), in the order of their endpoints' creation.
func (f fixture) enqueue(t *testing.T, typ string, data any) []uuid.UUID {
	t.Helper()
	return f.deliveries(t, f.publish(t, outbox.Event{Type: typ, Data: data}))
}

// publish commits one event and returns its id.
func (f fixture) publish(t *testing.T, ev outbox.Event) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) (err error) {
		id, err = outbox.Enqueue(ctx, tx, ev)
		return err
	})
	require.NoError(t, err)
	return id
}

// event returns the event of a message: the webhook-id its receiver sees.
func (f fixture) event(t *testing.T, message uuid.UUID) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	require.NoError(t, f.pool.QueryRow(context.Background(),
		"SELECT event_id FROM outbox_messages WHERE id = $1", message).Scan(&id))
	return id
}

// deliveries returns the ids of an event's messages, in the order of their
// endpoints' creation.
func (f fixture) deliveries(t *testing.T, event uuid.UUID) []uuid.UUID {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT m.id FROM outbox_messages m
		JOIN webhook_endpoints e ON e.id = m.destination WHERE m.event_id = $1 ORDER BY e.created_at, e.id`, event)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	return ids
}

// fastConfig makes retries and claims quick enough for tests.
func fastConfig() relay.Config {
	return relay.Config{
		PollInterval:    50 * time.Millisecond,
		BackoffBase:     20 * time.Millisecond,
		BackoffMax:      100 * time.Millisecond,
		DeliveryTimeout: 2 * time.Second,
		ClaimTimeout:    time.Minute,
		MaxAttempts:     5,
	}
}

// startRelay runs a relay (a real River client, its dispatch and heartbeat)
// until the test ends, when it stops as a worker does at SIGTERM.
func (f fixture) startRelay(t *testing.T, cfg relay.Config, transport relay.Transport) *relay.Relay {
	t.Helper()
	if transport == nil {
		transport = &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}
	}
	rl, err := relay.New(f.pool, cfg, transport, discardLogger(), nil)
	require.NoError(t, err)
	require.NoError(t, rl.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = rl.Stop(ctx)
	})
	return rl
}

func (f fixture) message(t *testing.T, id uuid.UUID) admin.MessageDetail {
	t.Helper()
	m, err := f.admin.Message(context.Background(), id)
	require.NoError(t, err)
	return m
}

func TestRelayDeliversSignedWebhook(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	ids := f.enqueue(t, "order.placed", map[string]any{"order_id": "o-1", "total_cents": 1000})
	require.Len(t, ids, 1)

	f.startRelay(t, fastConfig(), nil)
	within(t, 10*time.Second, func() bool { return f.message(t, ids[0]).Status == outbox.StatusDelivered }, "the message is delivered")

	event := f.event(t, ids[0])
	require.Equal(t, 1, rc.count(event))
	rc.mu.Lock()
	env, h := rc.bodies[event.String()], rc.headers[event.String()]
	rc.mu.Unlock()
	require.Equal(t, event.String(), env.ID, "the body's id is the event id, as webhook-id is")
	require.Equal(t, event.String(), h.Get("webhook-id"))
	require.Equal(t, "order.placed", env.Type)
	require.JSONEq(t, `{"order_id":"o-1","total_cents":1000}`, string(env.Data))
	require.Equal(t, "application/json", h.Get("Content-Type"))
	require.Zero(t, rc.badSigned)

	m := f.message(t, ids[0])
	require.Equal(t, 1, m.Attempts)
	require.NotNil(t, m.DeliveredAt)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// recorder is a Transport that keeps the URLs it was given.
type recorder struct{ urls []string }

func (r *recorder) Deliver(_ context.Context, d relay.Delivery) relay.Result {
	r.urls = append(r.urls, d.URL)
	return relay.Result{Acked: true}
}

func TestRouterSendsByKind(t *testing.T) {
	t.Parallel()
	web, nats := &recorder{}, &recorder{}
	r := relay.Router{destination.KindWebhook: web, destination.KindNATS: nats}
	ctx := context.Background()
	require.True(t, r.Deliver(ctx, relay.Delivery{URL: "https://example.com/hook"}).Acked)
	require.True(t, r.Deliver(ctx, relay.Delivery{URL: "nats:orders.events"}).Acked)
	require.Equal(t, []string{"https://example.com/hook"}, web.urls)
	require.Equal(t, []string{"nats:orders.events"}, nats.urls)

	res := r.Deliver(ctx, relay.Delivery{URL: "kafka:orders"})
	require.ErrorContains(t, res.Err, "no kafka connection is configured on this worker",
		"a kind this worker has no broker for fails the attempt and says why")
}
