package orders_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/events/eventstest"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/orders"
)

// validBody is the request most tests place: 2×500 + 1×250 = 1250, with the
// lines deliberately not in SKU order so "request order" is observable.
const validBody = `{"customer_id":"c-1","lines":[` +
	`{"sku":"Z-9","quantity":2,"unit_price_cents":500},` +
	`{"sku":"A-1","quantity":1,"unit_price_cents":250}]}`

var validLines = []orders.Line{
	{SKU: "Z-9", Quantity: 2, UnitPriceCents: 500},
	{SKU: "A-1", Quantity: 1, UnitPriceCents: 250},
}

type fixture struct {
	pool     *pgxpool.Pool
	svc      *orders.Service
	srv      *httptest.Server
	endpoint uuid.UUID
}

// setup gives the test its own database with one webhook endpoint subscribed
// to every event the module emits (its Events list, so an event added to the
// module is subscribed here too), so every emitted event becomes exactly one
// outbox row, and the real handler behind a test server.
func setup(t testing.TB) *fixture {
	t.Helper()
	pool := dbtest.Pool(t)
	eventstest.CheckEvents(t, pool.Config().ConnString())
	var endpoint uuid.UUID
	require.NoError(t, pool.QueryRow(context.Background(),
		`INSERT INTO webhook_endpoints (url, secret, event_types)
		 VALUES ('http://127.0.0.1:9/x', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', $1)
		 RETURNING id`, orders.Events).Scan(&endpoint))
	svc := orders.NewService(pool, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &fixture{pool: pool, svc: svc, srv: srv, endpoint: endpoint}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request to the handler. headers are key/value pairs, an empty
// value removing the header; Content-Type defaults to application/json for a
// request with a body.
func (f *fixture) do(t testing.TB, method, path string, body []byte, headers ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, f.srv.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	given := map[string]bool{} // a name given twice is sent twice
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		if given[headers[i]] {
			req.Header.Add(headers[i], headers[i+1])
			continue
		}
		given[headers[i]] = true
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := contracttest.Client(t, f.srv.Client()).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func (f *fixture) post(t testing.TB, body string, headers ...string) response {
	t.Helper()
	return f.do(t, http.MethodPost, "/orders", []byte(body), headers...)
}

// place posts body and requires it to be accepted.
func (f *fixture) place(t testing.TB, body string, headers ...string) (orders.Order, response) {
	t.Helper()
	res := f.post(t, body, headers...)
	require.Equal(t, http.StatusCreated, res.status, "body: %s", res.body)
	return decodeOrder(t, res), res
}

func decodeOrder(t testing.TB, res response) orders.Order {
	t.Helper()
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.DisallowUnknownFields()
	var o orders.Order
	require.NoError(t, dec.Decode(&o), "body: %s", res.body)
	return o
}

// requireProblem asserts an RFC 9457 problem with status and a detail that
// mentions each of mentions.
func requireProblem(t testing.TB, res response, status int, mentions ...string) httpjson.Problem {
	t.Helper()
	require.Equal(t, status, res.status, "body: %s", res.body)
	require.Equal(t, "application/problem+json", res.header.Get("Content-Type"))
	dec := json.NewDecoder(bytes.NewReader(res.body))
	dec.DisallowUnknownFields()
	var p httpjson.Problem
	require.NoError(t, dec.Decode(&p), "body: %s", res.body)
	require.Equal(t, status, p.Status, "the body's status is the response's")
	require.Equal(t, http.StatusText(status), p.Title)
	require.NotEmpty(t, strings.TrimSpace(p.Detail), "a problem says what is wrong")
	for _, m := range mentions {
		require.Contains(t, p.Detail, m, "the detail names the offending field")
	}
	return p
}

// counts are the rows of each table; outbox counts the outbox's events,
// each of which has its one message (the fixture's endpoint subscribes to
// every event type).
type counts struct{ orders, lines, outbox int }

func (f *fixture) counts(t testing.TB) counts {
	t.Helper()
	var c counts
	var messages int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM orders), (SELECT count(*) FROM order_lines),
		(SELECT count(*) FROM outbox_events), (SELECT count(*) FROM outbox_messages)`).
		Scan(&c.orders, &c.lines, &c.outbox, &messages))
	require.Equal(t, c.outbox, messages, "one message per event")
	return c
}

type message struct {
	typ         string
	destination uuid.UUID
	status      string
	payload     string
}

// messages returns the outbox rows of type typ, oldest first.
func (f *fixture) messages(t testing.TB, typ string) []message {
	t.Helper()
	rows, err := f.pool.Query(context.Background(),
		`SELECT m.type, m.destination, m.status, ev.payload::text
		FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id WHERE m.type = $1 ORDER BY m.id`, typ)
	require.NoError(t, err)
	defer rows.Close()
	var ms []message
	for rows.Next() {
		var m message
		require.NoError(t, rows.Scan(&m.typ, &m.destination, &m.status, &m.payload))
		ms = append(ms, m)
	}
	require.NoError(t, rows.Err())
	return ms
}

func TestPlaceCreatesOrderAndItsEventTogether(t *testing.T) {
	t.Parallel()
	f := setup(t)

	before := time.Now()
	got, res := f.place(t, validBody)

	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(res.body, &raw))
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	require.ElementsMatch(t, []string{"id", "customer_id", "status", "total_cents", "lines", "created_at"}, keys,
		"a placed order has no cancelled_at")

	require.NotEqual(t, uuid.Nil, got.ID)
	require.Equal(t, "c-1", got.CustomerID)
	require.Equal(t, orders.StatusPlaced, got.Status)
	require.Equal(t, int64(2*500+1*250), got.TotalCents)
	require.Equal(t, validLines, got.Lines, "lines come back in request order")
	require.WithinDuration(t, before, got.CreatedAt, time.Minute)
	require.Nil(t, got.CancelledAt)
	require.Equal(t, "/orders/"+got.ID.String(), res.header.Get("Location"))
	require.Empty(t, res.header.Get("Idempotent-Replayed"))

	require.Equal(t, counts{orders: 1, lines: 2, outbox: 1}, f.counts(t))

	ctx := context.Background()
	var (
		id                 uuid.UUID
		customer, status   string
		total              int64
		createdAt          time.Time
		hasKey, cancelledB bool
	)
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT id, customer_id, status, total_cents, created_at,
		idempotency_key IS NOT NULL, cancelled_at IS NOT NULL FROM orders`).
		Scan(&id, &customer, &status, &total, &createdAt, &hasKey, &cancelledB))
	require.Equal(t, got.ID, id)
	require.Equal(t, "c-1", customer)
	require.Equal(t, orders.StatusPlaced, status)
	require.Equal(t, int64(1250), total)
	require.True(t, got.CreatedAt.Equal(createdAt), "the response carries the stored created_at")
	require.False(t, hasKey, "no Idempotency-Key, none stored")
	require.False(t, cancelledB)

	rows, err := f.pool.Query(ctx, `SELECT line_no, sku, quantity, unit_price_cents FROM order_lines
		WHERE order_id = $1 ORDER BY line_no`, got.ID)
	require.NoError(t, err)
	var stored []orders.Line
	for i := 1; rows.Next(); i++ {
		var no int
		var l orders.Line
		require.NoError(t, rows.Scan(&no, &l.SKU, &l.Quantity, &l.UnitPriceCents))
		require.Equal(t, i, no, "line numbers are 1..n in request order")
		stored = append(stored, l)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, validLines, stored)

	msgs := f.messages(t, orders.EventPlaced)
	require.Len(t, msgs, 1)
	require.Equal(t, f.endpoint, msgs[0].destination)
	require.Equal(t, "pending", msgs[0].status)
	require.JSONEq(t, string(res.body), msgs[0].payload, "the event carries the order exactly as the response does")
}

// Order ids are UUIDv7: each order's id sorts after those placed before it,
// so the primary keys of orders and order_lines grow at their last page.
// Random ids would spread every insert over indexes that grow with every
// order, and the WAL and buffer evictions per order would grow with them.
func TestOrderIDsAreTimeOrdered(t *testing.T) {
	t.Parallel()
	f := setup(t)

	var prev uuid.UUID
	for i := range 3 {
		got, _ := f.place(t, validBody)
		require.Equal(t, uuid.Version(7), got.ID.Version(), "order %d: a UUIDv7", i)
		require.Positive(t, bytes.Compare(got.ID[:], prev[:]), "order %d: its id sorts after the previous order's", i)
		prev = got.ID
	}
}

// With nobody subscribed, the event is recorded (a later endpoint can have
// it replayed) and nothing is sent.
func TestPlaceWithoutSubscribersRecordsTheEventOnly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, err := f.pool.Exec(context.Background(), `DELETE FROM webhook_endpoints`)
	require.NoError(t, err)

	placed, _ := f.place(t, validBody)
	var events, messages int
	var key string
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM outbox_events), (SELECT count(*) FROM outbox_messages),
		(SELECT ordering_key FROM outbox_events WHERE type = 'order.placed')`).Scan(&events, &messages, &key))
	require.Equal(t, 1, events, "the event is recorded")
	require.Zero(t, messages, "nothing to send")
	require.Equal(t, placed.ID.String(), key, "an order's events are keyed by its id")
}

func TestGetOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	placed, res := f.place(t, validBody)

	got := f.do(t, http.MethodGet, "/orders/"+placed.ID.String(), nil)
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, string(res.body), string(got.body), "GET returns the order as POST did")
	got = f.do(t, http.MethodGet, "/orders/"+strings.ToUpper(placed.ID.String()), nil)
	require.Equal(t, http.StatusOK, got.status, "the canonical spelling, in any case")

	// One address per order: the other spellings uuid.Parse reads are
	// not found.
	for name, path := range map[string]string{
		"unknown uuid":   "/orders/" + uuid.NewString(),
		"nil uuid":       "/orders/" + uuid.Nil.String(),
		"not a uuid":     "/orders/not-a-uuid",
		"sql-ish":        "/orders/1%27%20OR%201=1",
		"urn":            "/orders/urn:uuid:" + placed.ID.String(),
		"braces":         "/orders/%7B" + placed.ID.String() + "%7D",
		"without dashes": "/orders/" + strings.ReplaceAll(placed.ID.String(), "-", ""),
	} {
		t.Run(name, func(t *testing.T) {
			requireProblem(t, f.do(t, http.MethodGet, path, nil), http.StatusNotFound)
		})
	}

	o, err := f.svc.Get(context.Background(), uuid.New())
	require.ErrorIs(t, err, orders.ErrNotFound)
	require.Zero(t, o)
}

func TestCancelEmitsOnceAndIsIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	placed, _ := f.place(t, validBody)
	path := "/orders/" + placed.ID.String() + "/cancel"

	first := f.do(t, http.MethodPost, path, nil)
	require.Equal(t, http.StatusOK, first.status, "body: %s", first.body)
	cancelled := decodeOrder(t, first)
	require.Equal(t, orders.StatusCancelled, cancelled.Status)
	require.NotNil(t, cancelled.CancelledAt)
	require.False(t, cancelled.CancelledAt.Before(cancelled.CreatedAt))
	// Everything but the status and cancelled_at is unchanged.
	want := placed
	want.Status, want.CancelledAt = cancelled.Status, cancelled.CancelledAt
	require.Equal(t, want, cancelled)

	second := f.do(t, http.MethodPost, path, nil)
	require.Equal(t, http.StatusOK, second.status)
	require.JSONEq(t, string(first.body), string(second.body), "cancelling again returns the cancelled order unchanged")

	got := f.do(t, http.MethodGet, "/orders/"+placed.ID.String(), nil)
	require.Equal(t, http.StatusOK, got.status)
	require.JSONEq(t, string(first.body), string(got.body))

	msgs := f.messages(t, orders.EventCancelled)
	require.Len(t, msgs, 1, "only the transition emits order.cancelled")
	require.JSONEq(t, string(first.body), msgs[0].payload)
	require.Equal(t, counts{orders: 1, lines: 2, outbox: 2}, f.counts(t))

	for name, path := range map[string]string{
		"unknown uuid": "/orders/" + uuid.NewString() + "/cancel",
		"not a uuid":   "/orders/nope/cancel",
	} {
		t.Run(name, func(t *testing.T) {
			requireProblem(t, f.do(t, http.MethodPost, path, nil), http.StatusNotFound)
		})
	}
	require.Equal(t, counts{orders: 1, lines: 2, outbox: 2}, f.counts(t), "a 404 writes nothing")
}

func TestConcurrentCancelsEmitOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	placed, _ := f.place(t, validBody)

	const n = 8
	results := make([]orders.Order, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = f.svc.Cancel(context.Background(), placed.ID)
		})
	}
	close(start)
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, orders.StatusCancelled, results[i].Status)
		require.Equal(t, results[0], results[i], "every caller sees the one cancellation")
	}
	require.Len(t, f.messages(t, orders.EventCancelled), 1)
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()

	t.Run("same key and body replays the first order", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		first, firstRes := f.place(t, validBody, "Idempotency-Key", "k-1")
		require.Empty(t, firstRes.header.Get("Idempotent-Replayed"))

		// The same request, formatted differently, is the same request.
		reformatted := `{ "lines": [ {"unit_price_cents":500,"quantity":2,"sku":"Z-9"},
			{"sku":"A-1","unit_price_cents":250,"quantity":1} ], "customer_id": "c-1" }`
		for _, body := range []string{validBody, reformatted} {
			again, res := f.place(t, body, "Idempotency-Key", "k-1")
			require.Equal(t, "true", res.header.Get("Idempotent-Replayed"))
			require.Equal(t, first.ID, again.ID)
			require.JSONEq(t, string(firstRes.body), string(res.body))
			require.Equal(t, firstRes.header.Get("Location"), res.header.Get("Location"))
		}
		require.Equal(t, counts{orders: 1, lines: 2, outbox: 1}, f.counts(t))

		var key string
		require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT idempotency_key FROM orders`).Scan(&key))
		require.Equal(t, "k-1", key)
	})

	t.Run("same key and another body is refused", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		f.place(t, validBody, "Idempotency-Key", "k-1")
		for name, body := range map[string]string{
			"other customer": strings.Replace(validBody, `"c-1"`, `"c-2"`, 1),
			"other quantity": strings.Replace(validBody, `"quantity":2`, `"quantity":3`, 1),
			"fewer lines":    `{"customer_id":"c-1","lines":[{"sku":"Z-9","quantity":2,"unit_price_cents":500}]}`,
			"lines reordered": `{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":250},` +
				`{"sku":"Z-9","quantity":2,"unit_price_cents":500}]}`,
		} {
			requireProblem(t, f.post(t, body, "Idempotency-Key", "k-1"), http.StatusUnprocessableEntity, "Idempotency-Key", "k-1")
			require.Equal(t, counts{orders: 1, lines: 2, outbox: 1}, f.counts(t), "%s: nothing new is written", name)
		}

		_, _, err := f.svc.Place(context.Background(), orders.PlaceRequest{
			CustomerID: "c-2", Lines: validLines, IdempotencyKey: "k-1",
		})
		require.ErrorIs(t, err, orders.ErrIdempotencyConflict)
	})

	t.Run("different keys place different orders", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		a, _ := f.place(t, validBody, "Idempotency-Key", "k-a")
		b, res := f.place(t, validBody, "Idempotency-Key", "k-b")
		c, _ := f.place(t, validBody)
		require.Empty(t, res.header.Get("Idempotent-Replayed"))
		require.NotEqual(t, a.ID, b.ID)
		require.NotEqual(t, b.ID, c.ID)
		require.Equal(t, counts{orders: 3, lines: 6, outbox: 3}, f.counts(t))
	})

	t.Run("concurrent retries place one order", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		const n = 8
		results := make([]response, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				// Not f.post: require must not run off the test goroutine.
				req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/orders", strings.NewReader(validBody))
				if err != nil {
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", "k-race")
				res, err := contracttest.Client(t, f.srv.Client()).Do(req)
				if err != nil {
					return
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(res.Body)
				results[i] = response{status: res.StatusCode, header: res.Header, body: b}
			})
		}
		close(start)
		wg.Wait()

		var ids []uuid.UUID
		created := 0
		for _, res := range results {
			require.Equal(t, http.StatusCreated, res.status, "body: %s", res.body)
			ids = append(ids, decodeOrder(t, res).ID)
			if res.header.Get("Idempotent-Replayed") == "" {
				created++
			}
		}
		require.Equal(t, 1, created, "exactly one request placed the order; the others replayed it")
		for _, id := range ids {
			require.Equal(t, ids[0], id)
		}
		require.Equal(t, counts{orders: 1, lines: 2, outbox: 1}, f.counts(t))
	})
}

// maxLinePrice is the largest amount one line can reach.
const maxLinePrice = int64(orders.MaxQuantity) * orders.MaxUnitPriceCents

// overflowLines is how many maximal lines overflow an int64 total.
var overflowLines = int(math.MaxInt64/maxLinePrice) + 1

func maxLine(sku string) string {
	b, _ := json.Marshal(orders.Line{SKU: sku, Quantity: orders.MaxQuantity, UnitPriceCents: orders.MaxUnitPriceCents})
	return string(b)
}

// body builds a request for customer with n copies of line.
func body(customer string, n int, line string) string {
	b, _ := json.Marshal(customer)
	return `{"customer_id":` + string(b) + `,"lines":[` + strings.TrimSuffix(strings.Repeat(line+",", n), ",") + `]}`
}

func TestPlaceAcceptsRequestsAtTheLimits(t *testing.T) {
	t.Parallel()
	one := `{"sku":"A","quantity":1,"unit_price_cents":1}`
	// The largest total the limits allow without overflowing.
	maxLines := min(overflowLines-1, orders.MaxLines)

	for name, tc := range map[string]struct {
		body    string
		headers []string
		total   int64
	}{
		"max quantity":    {body: body("c", 1, `{"sku":"A","quantity":1000000,"unit_price_cents":1}`), total: orders.MaxQuantity},
		"max price":       {body: body("c", 1, `{"sku":"A","quantity":1,"unit_price_cents":100000000000}`), total: orders.MaxUnitPriceCents},
		"free line":       {body: body("c", 1, `{"sku":"A","quantity":3,"unit_price_cents":0}`), total: 0},
		"max lines":       {body: body("c", orders.MaxLines, one), total: orders.MaxLines},
		"200-byte text":   {body: body(strings.Repeat("é", 100), 1, `{"sku":"`+strings.Repeat("s", 200)+`","quantity":1,"unit_price_cents":1}`), total: 1},
		"255-byte key":    {body: body("c", 1, one), headers: []string{"Idempotency-Key", strings.Repeat("k", 255)}, total: 1},
		"unicode text":    {body: body("客户 ✓", 1, `{"sku":"\u00e9-\ud83d\ude00","quantity":1,"unit_price_cents":1}`), total: 1},
		"largest total":   {body: body("c", maxLines, maxLine("A")), total: int64(maxLines) * maxLinePrice},
		"no content type": {body: validBody, headers: []string{"Content-Type", ""}, total: 1250},
		"json charset":    {body: validBody, headers: []string{"Content-Type", "application/json; charset=utf-8"}, total: 1250},
		// curl -d sends this by default; the body is read as JSON either way.
		"curl's form default": {body: validBody, headers: []string{"Content-Type", "application/x-www-form-urlencoded"}, total: 1250},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			res := f.post(t, tc.body, tc.headers...)
			require.Equal(t, http.StatusCreated, res.status, "body: %s", res.body)
			o := decodeOrder(t, res)
			require.Equal(t, tc.total, o.TotalCents)

			var req orders.PlaceRequest
			require.NoError(t, json.Unmarshal([]byte(tc.body), &req))
			require.Equal(t, req.CustomerID, o.CustomerID, "text is stored byte for byte")
			require.Equal(t, req.Lines, o.Lines)
			require.Equal(t, counts{orders: 1, lines: len(req.Lines), outbox: 1}, f.counts(t))
			msgs := f.messages(t, orders.EventPlaced)
			require.Len(t, msgs, 1)
			require.JSONEq(t, string(res.body), msgs[0].payload)
		})
	}
}
