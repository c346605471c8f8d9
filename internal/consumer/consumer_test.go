package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/consumer"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// fixture is a consumer behind a real HTTP server, on its own database.
type fixture struct {
	pool *pgxpool.Pool
	c    *consumer.Consumer
	url  string
	logs *bytes.Buffer
	mu   *sync.Mutex
}

func newSecret(t *testing.T) string {
	t.Helper()
	s, err := webhook.NewSecret()
	require.NoError(t, err)
	return s
}

func setup(t *testing.T, secrets ...string) *fixture {
	t.Helper()
	return setupWith(t, nil, secrets...)
}

// setupWith is setup with the consumer's options.
func setupWith(t *testing.T, opts []consumer.Option, secrets ...string) *fixture {
	t.Helper()
	pool := dbtest.Pool(t)
	logs, mu := &bytes.Buffer{}, &sync.Mutex{}
	logger := slog.New(slog.NewJSONHandler(lockedWriter{logs, mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	require.NoError(t, consumer.Migrate(context.Background(), pool, logger))
	v, err := webhook.NewVerifier(secrets...)
	require.NoError(t, err)
	c := consumer.New(pool, v, logger, opts...)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range secrets {
			require.NotContains(t, logs.String(), s, "a secret was logged")
		}
	})
	return &fixture{pool: pool, c: c, url: srv.URL, logs: logs, mu: mu}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// event builds the body the orders service sends for an order event.
func event(t *testing.T, id, typ, customer string, orderID uuid.UUID, total int64) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"id": id, "type": typ, "created_at": time.Now().UTC().Format(time.RFC3339Nano),
		"data": orderData(typ, customer, orderID, total),
	})
	require.NoError(t, err)
	return b
}

// orderData is an order as typ's data carries it (its schema in the
// description's webhooks): lines of at most the largest price, and when
// it was cancelled for a cancellation. The consumer reads the total.
func orderData(typ, customer string, orderID uuid.UUID, total int64) map[string]any {
	status, price := "placed", min(total, 100_000_000_000) // the schema's largest price
	data := map[string]any{"id": orderID, "customer_id": customer, "status": status, "total_cents": total,
		"lines":      []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": price}},
		"created_at": time.Now().UTC().Format(time.RFC3339Nano)}
	if typ == consumer.EventCancelled {
		data["status"], data["cancelled_at"] = "cancelled", time.Now().UTC().Format(time.RFC3339Nano)
	}
	return data
}

// post sends body as a delivery with id, signed by secret at ts, and returns
// the status and the consumer's outcome.
func post(t *testing.T, url, secret, id string, ts time.Time, body []byte) (int, consumer.Outcome) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	signer, err := webhook.NewSigner(secret)
	require.NoError(t, err)
	signer.SetHeaders(req.Header, id, ts, body)
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, consumer.Outcome) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var answer struct {
		Outcome consumer.Outcome `json:"outcome"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	return resp.StatusCode, answer.Outcome
}

func (f *fixture) stats(t *testing.T) consumer.Stats {
	t.Helper()
	s, err := f.c.Stats(context.Background())
	require.NoError(t, err)
	return s
}

// requireNothingWritten checks the consumer's tables are untouched.
func (f *fixture) requireNothingWritten(t *testing.T) {
	t.Helper()
	s := f.stats(t)
	require.Zero(t, s.InboxTotal, "inbox rows")
	require.Zero(t, s.LedgerTotal, "ledger rows")
	var customers int
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM consumer_customers").Scan(&customers))
	require.Zero(t, customers, "customer rows")
}

func TestDeliveryIsAppliedOnceAndDuplicatesAreAcknowledged(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)
	ctx := context.Background()
	id, orderID := uuid.NewString(), uuid.New()
	body := event(t, id, consumer.EventPlaced, "c-1", orderID, 1500)

	code, outcome := post(t, f.url, secret, id, time.Now(), body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Applied, outcome)

	// The relay's retry of the same message: same webhook-id, new timestamp
	// and signature. Acknowledged, and nothing changes.
	for range 3 {
		code, outcome = post(t, f.url, secret, id, time.Now(), body)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, consumer.Duplicate, outcome)
	}

	ledger, err := f.c.Ledger(ctx, "c-1")
	require.NoError(t, err)
	require.Len(t, ledger, 1)
	require.Equal(t, id, ledger[0].WebhookID)
	require.Equal(t, orderID, ledger[0].OrderID)
	require.EqualValues(t, 1500, ledger[0].AmountCents)
	cust, err := f.c.Customer(ctx, "c-1")
	require.NoError(t, err)
	require.EqualValues(t, 1, cust.OrdersPlaced)
	require.EqualValues(t, 1500, cust.BalanceCents, "a duplicate must not add to the balance again")

	// The cancellation is another message: applied, reversing the amount.
	cancelID := uuid.NewString()
	cancelBody := event(t, cancelID, consumer.EventCancelled, "c-1", orderID, 1500)
	for i := range 2 {
		code, outcome = post(t, f.url, secret, cancelID, time.Now(), cancelBody)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, []consumer.Outcome{consumer.Applied, consumer.Duplicate}[i], outcome)
	}
	cust, err = f.c.Customer(ctx, "c-1")
	require.NoError(t, err)
	require.EqualValues(t, 1, cust.OrdersCancelled)
	require.Zero(t, cust.BalanceCents)

	s := f.stats(t)
	require.EqualValues(t, 2, s.Applied)
	require.EqualValues(t, 4, s.Duplicates)
	require.EqualValues(t, 2, s.InboxTotal)
	require.EqualValues(t, 2, s.LedgerTotal)
}

// Two deliveries of one message in flight at once (a stale claim released
// while the first attempt is still sending) still apply once: the second
// waits on the inbox's unique key and then finds the first's row.
func TestConcurrentDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)
	const n = 8
	id := uuid.NewString()
	body := event(t, id, consumer.EventPlaced, "c-2", uuid.New(), 700)
	outcomes := make([]consumer.Outcome, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, f.url, bytes.NewReader(body))
			if err != nil {
				panic(err)
			}
			signer, _ := webhook.NewSigner(secret)
			signer.SetHeaders(req.Header, id, time.Now(), body)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var a struct {
				Outcome consumer.Outcome `json:"outcome"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&a)
			codes[i], outcomes[i] = resp.StatusCode, a.Outcome
		})
	}
	wg.Wait()
	counts := map[consumer.Outcome]int{}
	for i := range n {
		require.Equal(t, http.StatusOK, codes[i])
		counts[outcomes[i]]++
	}
	require.Equal(t, map[consumer.Outcome]int{consumer.Applied: 1, consumer.Duplicate: n - 1}, counts)
	cust, err := f.c.Customer(context.Background(), "c-2")
	require.NoError(t, err)
	require.EqualValues(t, 700, cust.BalanceCents)
}

func TestForgedDeliveriesAreRejectedAndWriteNothing(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)
	id := uuid.NewString()
	body := event(t, id, consumer.EventPlaced, "c-3", uuid.New(), 100)
	signer, err := webhook.NewSigner(secret)
	require.NoError(t, err)

	tests := []struct {
		name  string
		setup func(h http.Header) []byte
	}{
		{"signed with another secret", func(h http.Header) []byte {
			other, _ := webhook.NewSigner(newSecret(t))
			other.SetHeaders(h, id, time.Now(), body)
			return body
		}},
		{"body changed after signing", func(h http.Header) []byte {
			signer.SetHeaders(h, id, time.Now(), body)
			return bytes.Replace(body, []byte(`"total_cents":100`), []byte(`"total_cents":100000`), 1)
		}},
		{"webhook-id swapped", func(h http.Header) []byte {
			signer.SetHeaders(h, id, time.Now(), body)
			h.Set(webhook.HeaderID, uuid.NewString())
			return body
		}},
		{"no signature", func(h http.Header) []byte {
			signer.SetHeaders(h, id, time.Now(), body)
			h.Del(webhook.HeaderSignature)
			return body
		}},
		{"unknown signature version only", func(h http.Header) []byte {
			signer.SetHeaders(h, id, time.Now(), body)
			h.Set(webhook.HeaderSignature, "v1a,"+h.Get(webhook.HeaderSignature)[3:])
			return body
		}},
		{"no headers at all", func(h http.Header) []byte { return body }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, f.url, nil)
			require.NoError(t, err)
			b := tc.setup(req.Header)
			req.Body = io.NopCloser(bytes.NewReader(b))
			req.ContentLength = int64(len(b))
			code, outcome := do(t, req)
			require.Equal(t, http.StatusUnauthorized, code)
			require.Equal(t, consumer.BadSignature, outcome)
		})
	}
	f.requireNothingWritten(t)
	require.EqualValues(t, len(tests), f.stats(t).BadSignature)
}

func TestStaleOrFutureTimestampIsRejected(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)
	id := uuid.NewString()
	body := event(t, id, consumer.EventPlaced, "c-4", uuid.New(), 100)
	for _, skew := range []time.Duration{-webhook.DefaultTolerance - time.Minute, webhook.DefaultTolerance + time.Minute, -24 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			// Correctly signed, but at the wrong time: a replay of a
			// captured delivery looks exactly like this.
			code, outcome := post(t, f.url, secret, id, time.Now().Add(skew), body)
			require.Equal(t, http.StatusUnauthorized, code)
			require.Equal(t, consumer.StaleTimestamp, outcome)
		})
	}
	t.Run("not a number", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPost, f.url, bytes.NewReader(body))
		require.NoError(t, err)
		signer, _ := webhook.NewSigner(secret)
		signer.SetHeaders(req.Header, id, time.Now(), body)
		req.Header.Set(webhook.HeaderTimestamp, "yesterday")
		code, outcome := do(t, req)
		require.Equal(t, http.StatusUnauthorized, code)
		require.Equal(t, consumer.StaleTimestamp, outcome)
	})
	f.requireNothingWritten(t)

	// Within the tolerance the same delivery is accepted.
	code, outcome := post(t, f.url, secret, id, time.Now().Add(-webhook.DefaultTolerance+time.Minute), body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Applied, outcome)
}

// During a rotation the consumer accepts the old and the new secret, so the
// sender can switch at any moment; a third secret is still refused.
func TestRotationAcceptsEverySecretConfigured(t *testing.T) {
	t.Parallel()
	oldSecret, newSecretValue := newSecret(t), newSecret(t)
	f := setup(t, oldSecret, newSecretValue)
	for i, secret := range []string{oldSecret, newSecretValue} {
		id := uuid.NewString()
		code, outcome := post(t, f.url, secret, id, time.Now(), event(t, id, consumer.EventPlaced, "c-5", uuid.New(), 100))
		require.Equal(t, http.StatusOK, code, "secret %d", i)
		require.Equal(t, consumer.Applied, outcome)
	}
	// A sender mid-rotation signs with both: one header, two signatures.
	id := uuid.NewString()
	body := event(t, id, consumer.EventPlaced, "c-5", uuid.New(), 100)
	req, err := http.NewRequest(http.MethodPost, f.url, bytes.NewReader(body))
	require.NoError(t, err)
	now := time.Now()
	oldKey, err := webhook.ParseSecret(oldSecret)
	require.NoError(t, err)
	otherKey, err := webhook.ParseSecret(newSecret(t))
	require.NoError(t, err)
	req.Header.Set(webhook.HeaderID, id)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(webhook.HeaderSignature, webhook.Sign(otherKey, id, now, body)+" "+webhook.Sign(oldKey, id, now, body))
	code, outcome := do(t, req)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Applied, outcome)

	id = uuid.NewString()
	code, outcome = post(t, f.url, newSecret(t), id, time.Now(), event(t, id, consumer.EventPlaced, "c-5", uuid.New(), 100))
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, consumer.BadSignature, outcome)

	cust, err := f.c.Customer(context.Background(), "c-5")
	require.NoError(t, err)
	require.EqualValues(t, 3, cust.OrdersPlaced)
}

func TestAuthenticButUnusableDeliveries(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)

	// An event type the consumer does not handle: acknowledged once and
	// recorded, so the sender stops; no effect.
	id := uuid.NewString()
	body := event(t, id, "order.shipped", "c-6", uuid.New(), 100)
	code, outcome := post(t, f.url, secret, id, time.Now(), body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Ignored, outcome)
	code, outcome = post(t, f.url, secret, id, time.Now(), body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Duplicate, outcome)
	s := f.stats(t)
	require.EqualValues(t, 1, s.InboxTotal)
	require.Zero(t, s.LedgerTotal)

	tests := []struct {
		name string
		body func(id string) []byte
	}{
		{"not JSON", func(string) []byte { return []byte("hello") }},
		{"body id differs from webhook-id", func(string) []byte {
			return event(t, uuid.NewString(), consumer.EventPlaced, "c-6", uuid.New(), 100)
		}},
		{"data is not an order", func(id string) []byte {
			return []byte(fmt.Sprintf(`{"id":%q,"type":"order.placed","created_at":"2026-01-01T00:00:00Z","data":{"sku":"x"}}`, id))
		}},
		// What the ledger reads is there, but not what the published
		// schema requires: the sender broke its contract.
		{"data its schema refuses", func(id string) []byte {
			return []byte(fmt.Sprintf(`{"id":%q,"type":"order.placed","created_at":"2026-01-01T00:00:00Z",`+
				`"data":{"id":%q,"customer_id":"c-6","status":"placed","total_cents":100}}`, id, uuid.NewString()))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := uuid.NewString()
			code, outcome := post(t, f.url, secret, id, time.Now(), tc.body(id))
			require.Equal(t, http.StatusBadRequest, code)
			require.Equal(t, consumer.BadRequest, outcome)
		})
	}
	s = f.stats(t)
	require.EqualValues(t, 1, s.InboxTotal, "a rejected event leaves no inbox row, so a fixed sender can still deliver it")
	require.Zero(t, s.LedgerTotal)

	// Data the ledger cannot take fails the same way on every retry: a
	// second order that would take the customer's balance past a bigint is
	// refused as unusable (400, nothing recorded), not answered as a
	// database failure (500) that the sender would retry to the end while
	// backing off the whole endpoint.
	t.Run("balance out of range", func(t *testing.T) {
		const huge = 5_000_000_000_000_000_000
		first := uuid.NewString()
		code, outcome := post(t, f.url, secret, first, time.Now(), event(t, first, consumer.EventPlaced, "c-big", uuid.New(), huge))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, consumer.Applied, outcome)
		second := uuid.NewString()
		code, outcome = post(t, f.url, secret, second, time.Now(), event(t, second, consumer.EventPlaced, "c-big", uuid.New(), huge))
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, consumer.BadRequest, outcome)
		c, err := f.c.Customer(context.Background(), "c-big")
		require.NoError(t, err)
		require.EqualValues(t, huge, c.BalanceCents, "the first order only")
		s := f.stats(t)
		require.EqualValues(t, 2, s.InboxTotal, "the ignored event and the first order; not the refused one")
		require.EqualValues(t, 1, s.LedgerTotal)
	})

	t.Run("body over the limit", func(t *testing.T) {
		id := uuid.NewString()
		big := bytes.Repeat([]byte("x"), consumer.MaxBody+1)
		code, outcome := post(t, f.url, secret, id, time.Now(), big)
		require.Equal(t, http.StatusRequestEntityTooLarge, code)
		require.Equal(t, consumer.BadRequest, outcome)
	})
	t.Run("GET", func(t *testing.T) {
		resp, err := http.Get(f.url)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	})
}

// The consumer's migrations are its own: their version table is separate
// from the orders service's, and applying them again changes nothing.
func TestMigrateOwnsItsHistory(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t) // already carries the orders service's schema
	ctx := context.Background()
	var appVersion int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version_id) FROM goose_db_version").Scan(&appVersion))
	logger := slog.New(slog.DiscardHandler)
	require.NoError(t, consumer.Migrate(ctx, pool, logger))
	require.NoError(t, consumer.Migrate(ctx, pool, logger), "running it twice is harmless")

	var consumerVersion, rows int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version_id), count(*) FROM "+consumer.VersionTable+" WHERE version_id > 0").
		Scan(&consumerVersion, &rows))
	require.EqualValues(t, 2, consumerVersion, "its own migrations, all applied")
	require.EqualValues(t, 2, rows, "once each")
	var after int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version_id) FROM goose_db_version").Scan(&after))
	require.Equal(t, appVersion, after, "the orders service's history is untouched")
}

// An order.cancelled before its order.placed is refused with 409 and leaves
// nothing behind: the sender retries it, and once the placement is applied
// the cancellation is too.
func TestCancellationBeforeItsPlacementIsRefusedUntilThePlacement(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)
	orderID := uuid.New()
	cancelID, placeID := uuid.NewString(), uuid.NewString()
	cancelBody := event(t, cancelID, consumer.EventCancelled, "c-1", orderID, 1500)

	code, outcome := post(t, f.url, secret, cancelID, time.Now(), cancelBody)
	require.Equal(t, http.StatusConflict, code)
	require.Equal(t, consumer.OutOfOrder, outcome)
	f.requireNothingWritten(t)

	code, outcome = post(t, f.url, secret, placeID, time.Now(), event(t, placeID, consumer.EventPlaced, "c-1", orderID, 1500))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Applied, outcome)
	code, outcome = post(t, f.url, secret, cancelID, time.Now(), cancelBody)
	require.Equal(t, http.StatusOK, code, "the retry, after the placement, is applied")
	require.Equal(t, consumer.Applied, outcome)

	s := f.stats(t)
	require.EqualValues(t, 1, s.OutOfOrder)
	require.EqualValues(t, 2, s.LedgerTotal)
	cust, err := f.c.Customer(context.Background(), "c-1")
	require.NoError(t, err)
	require.Zero(t, cust.BalanceCents)
}

// One event sent to two endpoints that both lead to this consumer (as when
// a receiver registers its new URL before deleting the old one) carries one
// webhook-id, the event id: the real relay delivers it twice, and it is
// applied once.
func TestAnEventThroughTwoEndpointsIsAppliedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	logger := slog.New(slog.DiscardHandler)
	require.NoError(t, consumer.Migrate(ctx, pool, logger))
	admin := admin.New(pool, netguard.Guard{AllowPrivate: true}, logger)

	// The consumer answers on two paths; its endpoints are registered first
	// so it can be given both secrets.
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var secrets []string
	for _, path := range []string{"/old", "/new"} {
		ep, err := admin.CreateEndpoint(ctx, srv.URL+path, []string{consumer.EventPlaced})
		require.NoError(t, err)
		secrets = append(secrets, ep.Secret)
	}
	v, err := webhook.NewVerifier(secrets...)
	require.NoError(t, err)
	c := consumer.New(pool, v, logger)
	var mu sync.Mutex
	deliveries := map[string]int{}
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		deliveries[r.URL.Path]++
		mu.Unlock()
		c.ServeHTTP(w, r)
	})
	mux.Handle("/old", counting)
	mux.Handle("/new", counting)

	orderID := uuid.New()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: consumer.EventPlaced, OrderingKey: orderID.String(),
			Data: orderData(consumer.EventPlaced, "c-1", orderID, 1500)})
		return err
	}))
	relay, err := relay.New(pool, relay.Config{}, &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}, logger, nil)
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = relay.Stop(stop)
	})
	require.Eventually(t, func() bool {
		s, err := admin.Stats(ctx)
		return err == nil && s.Delivered == 2
	}, 20*time.Second, 20*time.Millisecond, "both endpoints got the event")

	mu.Lock()
	require.Equal(t, map[string]int{"/old": 1, "/new": 1}, deliveries)
	mu.Unlock()
	s, err := c.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Applied)
	require.EqualValues(t, 1, s.Duplicates, "the second endpoint's delivery is a duplicate of the first")
	require.EqualValues(t, 1, s.LedgerTotal)
	cust, err := c.Customer(ctx, "c-1")
	require.NoError(t, err)
	require.EqualValues(t, 1500, cust.BalanceCents, "applied once")
}

// The inbox forgets webhook-ids past its retention, in batches, and keeps
// the ledger: a redelivery of a recent id is still a duplicate, and the
// effects of forgotten ones stay applied.
func TestPruneInboxForgetsOnlyWhatIsPastItsRetention(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setup(t, secret)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		id := uuid.NewString()
		code, outcome := post(t, f.url, secret, id, time.Now(), event(t, id, consumer.EventPlaced, "c-1", uuid.New(), 100))
		require.Equal(t, http.StatusOK, code, i)
		require.Equal(t, consumer.Applied, outcome)
		ids = append(ids, id)
	}
	// Two of them received 31 days ago, and more old ids than one batch.
	_, err := f.pool.Exec(ctx, `UPDATE consumer_inbox SET received_at = now() - interval '31 days' WHERE webhook_id = ANY ($1)`, ids[:2])
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `INSERT INTO consumer_inbox (webhook_id, event_type, received_at)
		SELECT 'old-' || g, 'order.placed', now() - interval '40 days' FROM generate_series(1, 12000) g`)
	require.NoError(t, err)

	n, err := f.c.PruneInbox(ctx, time.Now().Add(-30*24*time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 12_002, n)
	s := f.stats(t)
	require.EqualValues(t, 1, s.InboxTotal, "only the recent id is remembered")
	require.EqualValues(t, 3, s.LedgerTotal, "every effect is kept")

	code, outcome := post(t, f.url, secret, ids[2], time.Now(), event(t, ids[2], consumer.EventPlaced, "c-1", uuid.New(), 100))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Duplicate, outcome, "a recent id is still deduplicated")
	cust, err := f.c.Customer(ctx, "c-1")
	require.NoError(t, err)
	require.EqualValues(t, 300, cust.BalanceCents)
}

// Each event applied is measured from its event's time to its effect's
// commit, and one applied later than the threshold is logged: an event
// written ten minutes ago lands in the histogram at ten minutes or more
// and is logged as late, one written now is neither late nor measured as
// ten minutes, and its redelivery (a duplicate) is not measured again.
func TestAnEventAppliedLateIsMeasuredAndLogged(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setupWith(t, []consumer.Option{consumer.WithLateAfter(time.Minute)}, secret)
	written := time.Now().Add(-10 * time.Minute)
	late, prompt := uuid.NewString(), uuid.NewString()
	body, err := json.Marshal(map[string]any{"id": late, "type": consumer.EventPlaced, "created_at": written.UTC().Format(time.RFC3339Nano),
		"data": orderData(consumer.EventPlaced, "cus_late", uuid.New(), 100)})
	require.NoError(t, err)
	start := time.Now()
	code, outcome := post(t, f.url, secret, late, time.Now(), body)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Applied, outcome)
	elapsed := time.Since(start)
	code, outcome = post(t, f.url, secret, late, time.Now(), body)
	require.Equal(t, consumer.Duplicate, outcome, "redelivered: %d", code)
	code, outcome = post(t, f.url, secret, prompt, time.Now(), event(t, prompt, consumer.EventPlaced, "cus_prompt", uuid.New(), 100))
	require.Equal(t, consumer.Applied, outcome, "%d", code)

	reg := prometheus.NewPedanticRegistry()
	for _, c := range f.c.Collectors() {
		require.NoError(t, reg.Register(c))
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	i := slices.IndexFunc(families, func(m *dto.MetricFamily) bool { return m.GetName() == "consumer_event_lag_seconds" })
	require.GreaterOrEqual(t, i, 0, "the consumer reports its events' lag")
	h := families[i].GetMetric()[0].GetHistogram()
	require.EqualValues(t, 2, h.GetSampleCount(), "the two events applied; not the duplicate")
	require.GreaterOrEqual(t, h.GetSampleSum(), (10 * time.Minute).Seconds(), "the late one counts its ten minutes")
	require.Less(t, h.GetSampleSum(), (10*time.Minute + 2*elapsed + 5*time.Second).Seconds(), "and the prompt one little")
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 300 {
			require.EqualValues(t, 1, b.GetCumulativeCount(), "one under five minutes: the prompt one")
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	var lateLogs []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(f.logs.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if rec["msg"] == "event applied late" {
			lateLogs = append(lateLogs, rec)
		}
	}
	require.Len(t, lateLogs, 1, "the late event alone is logged as late")
	require.Equal(t, late, lateLogs[0]["event_id"])
	require.Equal(t, "WARN", lateLogs[0]["level"])
}
