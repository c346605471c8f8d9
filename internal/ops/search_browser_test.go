package ops_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// location is where the browser is.
func (p browserPage) location() string {
	p.t.Helper()
	loc, err := chromedp.Run(p.ctx, chromedp.Location())
	require.NoError(p.t, err)
	return loc
}

var listedRow = regexp.MustCompile(`<tr id="message-([0-9a-f-]{36})"`)

// listed is the ids of the message list's rows, top to bottom (none when
// the list is empty).
func (p browserPage) listed() []string {
	p.t.Helper()
	if !p.exists("#messages") {
		return nil
	}
	var ids []string
	for _, m := range listedRow.FindAllStringSubmatch(p.html("#messages"), -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// exists reports whether the loaded page has an element sel.
func (p browserPage) exists(sel string) bool {
	p.t.Helper()
	n, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q) !== null`, sel)))
	require.NoError(p.t, err)
	return n
}

// ids runs a query of ids and returns them as text, in its order.
func ids(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var id uuid.UUID
		err := r.Scan(&id)
		return id.String(), err
	})
	require.NoError(t, err)
	return got
}

// signIn signs in through the login form at base's overview.
func signIn(t *testing.T, b browserPage, base string) {
	t.Helper()
	b.do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, b.ctx, chromedp.Click(chromedp.ID("login")))
	b.do(chromedp.WaitReady(chromedp.ID("search")))
}

// TestBrowserSearchLandsOnTheRightPage types ids into the one search box,
// in headless Chromium with scripts off, against the real api: a message
// id opens that message, an event id lists its deliveries, an order id its
// events' deliveries, another ordering key its events' deliveries, part
// of an endpoint's URL or its id its page, and an event that no
// endpoint was subscribed to says it has no deliveries. What each page
// lists is what the database holds. On the way, the empty overview links
// to the new-endpoint form, and the overview's shortened ids show in full
// on hover.
func TestBrowserSearchLandsOnTheRightPage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	a := startAPI(t, ctx, nil)
	base, pool := a.base, a.pool
	b := browserPage{t, bctx}
	do, attr, text := b.do, b.attr, b.text

	// No endpoint yet: the overview says so, and leads to the form.
	signIn(t, b, base)
	do(chromedp.WaitReady(chromedp.ID("no-endpoints")))
	require.Zero(t, count(t, pool, `SELECT count(*) FROM webhook_endpoints`), "the empty state shows while no endpoint exists")
	shot("40-overview-no-endpoints.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("new-endpoint-empty")))
	do(chromedp.WaitReady(chromedp.ID("save")))
	require.Equal(t, base+"/ops/endpoints/new", b.location())

	// Two endpoints of order.placed, none of order.cancelled: a
	// cancellation is recorded with no delivery.
	placedA := apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": "http://127.0.0.1:9/search/a", "event_types": []string{"order.placed"}})
	placedB := apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": "http://127.0.0.1:9/search/b", "event_types": []string{"order.placed"}})
	var orders []string
	for i := range 4 {
		o := apiJSON[struct {
			ID string `json:"id"`
		}](t, base, "POST", "/orders", map[string]any{"customer_id": fmt.Sprintf("c-%d", i),
			"lines": []map[string]any{{"sku": "S-1", "quantity": i + 1, "unit_price_cents": 300}}})
		orders = append(orders, o.ID)
	}
	apiJSON[map[string]any](t, base, "POST", "/orders/"+orders[1]+"/cancel", nil)

	search := func(q string) {
		t.Helper()
		do(chromedp.WaitReady(chromedp.ID("search")), chromedp.SetValue(chromedp.ID("search"), q))
		follow(t, bctx, chromedp.SendKeys(chromedp.ID("search"), "\n"))
	}

	// The overview's message ids are shortened: the full id is on hover.
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("search")))
	overview := b.html("main")
	links := regexp.MustCompile(`<a class="mono" href="/ops/messages/([0-9a-f-]{36})"( title="([^"]*)")?>`).FindAllStringSubmatch(overview, -1)
	require.NotEmpty(t, links, "the overview lists the recent messages")
	for _, l := range links {
		require.Equal(t, l[1], l[3], "a shortened id on the overview shows its full id on hover (UUIDv7 ids written together share their start)")
	}
	shot("41-overview-recent.png")

	// A message id: that message's page, with the database's status.
	msg := ids(t, pool, `SELECT id FROM outbox_messages WHERE destination = $1 ORDER BY id LIMIT 1`, placedB.ID)[0]
	search(msg)
	do(chromedp.WaitReady(chromedp.ID("message-status")))
	require.Equal(t, base+"/ops/messages/"+msg, b.location(), "a message id opens its message")
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE id = $1`, msg).Scan(&status))
	require.Equal(t, status, attr("#message-status", "data-status"), "the page shows the message's status in the database")
	shot("42-search-message-id.png")

	// An event id (the webhook-id a receiver saw): every delivery of it.
	event := ids(t, pool, `SELECT event_id FROM outbox_messages WHERE id = $1`, msg)[0]
	search(event)
	do(chromedp.WaitReady(chromedp.ID("messages")))
	require.Equal(t, base+"/ops/messages?"+url.Values{"event": {event}}.Encode(), b.location())
	require.Equal(t, ids(t, pool, `SELECT id FROM outbox_messages WHERE event_id = $1 ORDER BY id DESC`, event), b.listed(),
		"an event id lists every delivery of that event, newest first")
	require.Equal(t, event, attr("#f-event", "value"), "the list says what it is filtered by")
	shot("43-search-event-id.png")

	// An order id: the deliveries of the order's events (its key).
	search(orders[1])
	do(chromedp.WaitReady(chromedp.ID("messages")))
	require.Equal(t, ids(t, pool, `SELECT id FROM outbox_messages WHERE ordering_key = $1 ORDER BY id DESC`, orders[1]), b.listed(),
		"an order id lists the deliveries of that order's events, newest first")
	require.Equal(t, orders[1], attr("#f-key", "value"))
	shot("44-search-order-id.png")

	// Another module's ordering key, whenever its events were written: the
	// deliveries of its events.
	const invoice = "invoice-77"
	for i := range 2 {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", OrderingKey: invoice, Data: map[string]int{"n": i}})
			return err
		}))
	}
	search(invoice)
	do(chromedp.WaitReady(chromedp.ID("messages")))
	require.Equal(t, ids(t, pool, `SELECT id FROM outbox_messages WHERE ordering_key = $1 ORDER BY id DESC`, invoice), b.listed(),
		"an ordering key lists the deliveries of its events, newest first")
	require.Equal(t, invoice, attr("#f-key", "value"))

	// Part of one endpoint's URL: its page; of no endpoint's: nothing found.
	search("search/b")
	do(chromedp.WaitReady(chromedp.ID("endpoint-url")))
	require.Equal(t, base+"/ops/endpoints/"+placedB.ID.String(), b.location(), "the one endpoint whose URL holds it")
	search("search/zzz")
	do(chromedp.WaitReady(chromedp.ID("nothing-found")))
	require.Contains(t, text("#nothing-found"), "search/zzz")

	// An endpoint id: its page.
	search(placedA.ID.String())
	do(chromedp.WaitReady(chromedp.ID("endpoint-url")))
	require.Equal(t, base+"/ops/endpoints/"+placedA.ID.String(), b.location(), "an endpoint id opens its endpoint")
	var epURL string
	require.NoError(t, pool.QueryRow(ctx, `SELECT url FROM webhook_endpoints WHERE id = $1`, placedA.ID).Scan(&epURL))
	require.Equal(t, epURL, text("#endpoint-url"))
	shot("45-search-endpoint-id.png")

	// The cancellation, which no endpoint was subscribed to: recorded, no
	// delivery, and the page says so rather than "nothing found".
	noDelivery := ids(t, pool, `SELECT id FROM outbox_events ev
		WHERE NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.event_id = ev.id)`)
	require.Len(t, noDelivery, 1, "one event was recorded without deliveries: the cancellation")
	search(noDelivery[0])
	do(chromedp.WaitReady(chromedp.ID("event-found")))
	require.Contains(t, text("#event-found"), noDelivery[0])
	require.Contains(t, text("#event-found"), "no deliveries")
	require.False(t, b.exists("#nothing-found"))
	shot("46-search-event-without-deliveries.png")
}
