package ops_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// An incident as the on-call engineer sees it, in a real browser against
// the real api: first no worker runs at all (the overview is red and the
// endpoints say they are not delivering, though nothing failed), then a
// relay at its defaults meets a receiver that refuses connections (its
// endpoint's page says the circuit is open and when it probes next), and
// the search box takes an order id to that order's deliveries.
func TestBrowserRelayDownThenCircuitOpen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	b := browserPage{t, bctx}
	do, text, attr := b.do, b.text, b.attr

	// A receiver that refuses connections: a server's address, closed.
	gone := httptest.NewServer(http.NotFoundHandler())
	refusing := gone.URL + "/webhooks"
	gone.Close()
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(healthy.Close)

	a := startAPI(t, ctx, nil)
	base, pool := a.base, a.pool

	down := apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": refusing, "event_types": []string{"order.placed", "order.cancelled"}})
	apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": healthy.URL + "/hooks", "event_types": []string{"order.placed"}})
	var orders []string
	for i := range 8 {
		o := apiJSON[struct {
			ID string `json:"id"`
		}](t, base, "POST", "/orders", map[string]any{"customer_id": fmt.Sprintf("c-%d", i),
			"lines": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 900}}})
		orders = append(orders, o.ID)
	}
	apiJSON[map[string]any](t, base, "POST", "/orders/"+orders[3]+"/cancel", nil)

	// No worker: the overview says so in red, and so does every endpoint.
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, bctx, chromedp.Click(chromedp.ID("login")))
	do(chromedp.WaitReady(chromedp.ID("relay")))
	require.Equal(t, admin.RelayDown, attr("#relay", "data-state"))
	require.Contains(t, text("#relay-h"), "No relay running")
	require.Equal(t, "0", attr("#relays-alive", "data-value"))
	require.Equal(t, strconv.FormatInt(count(t, pool, `SELECT count(*) FROM outbox_relays
		WHERE heartbeat_at >= now() - make_interval(secs => timeout_seconds)`), 10), attr("#relays-alive", "data-value"))
	require.Equal(t, "17", attr("#due-count", "data-value"), "8 placed to two endpoints, 1 cancelled to one: all due")
	require.Equal(t, strconv.FormatInt(count(t, pool, `SELECT count(*) FROM outbox_messages WHERE status = 'pending' AND next_attempt_at <= now()`), 10),
		attr("#due-count", "data-value"), "the page's due count is the database's")
	require.Contains(t, text("#endpoint-"+down.ID.String()), "not delivering")
	shot("11-overview-relay-down.png")

	// A relay at its defaults: the healthy endpoint gets everything, the
	// refusing one opens its circuit after its failures in a row.
	a.startRelay(t, ctx, relay.Config{})
	require.Eventually(t, func() bool {
		var health string
		require.NoError(t, pool.QueryRow(ctx, `SELECT health FROM webhook_endpoints WHERE id = $1`, down.ID).Scan(&health))
		return health == outbox.HealthBackingOff
	}, 60*time.Second, 50*time.Millisecond, "the refusing endpoint's circuit never opened")
	require.Eventually(t, func() bool {
		do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("relay")))
		return attr("#relay", "data-state") == admin.RelayRunning && attr("#relays-alive", "data-value") == "1"
	}, 30*time.Second, 200*time.Millisecond, "the overview never showed the relay running")
	require.Equal(t, outbox.HealthBackingOff, attr("#endpoint-"+down.ID.String(), "data-health"))
	shot("12-overview-circuit-open.png")

	follow(t, bctx, chromedp.Click(chromedp.CSS(`#endpoint-`+down.ID.String()+` .url a`)))
	do(chromedp.WaitReady(chromedp.ID("endpoint-state")))
	require.Equal(t, outbox.HealthBackingOff, attr("#endpoint-state", "data-state"))
	require.Contains(t, text("#endpoint-state"), "circuit open")
	require.Contains(t, text(".kpi-note"), "next probe")
	require.Equal(t, "9", attr("#endpoint-waiting", "data-value"), "its 9 messages wait, none failed")
	require.Equal(t, strconv.FormatInt(count(t, pool, `SELECT count(*) FROM outbox_messages WHERE destination = '`+down.ID.String()+`'
		AND status IN ('pending', 'claimed')`), 10), attr("#endpoint-waiting", "data-value"), "the page's waiting count is the database's")
	require.Equal(t, strconv.FormatInt(count(t, pool, `SELECT count(*) FROM outbox_messages WHERE destination = '`+down.ID.String()+`'
		AND status = 'failed'`), 10), attr("#endpoint-failed", "data-value"), "circuit open: waiting costs no attempts, so none failed")
	page, err := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.ID("attempts")))
	require.NoError(t, err)
	require.Contains(t, page, "connection refused")
	shot("13-endpoint-circuit-open.png")

	// Probe now: with its next probe put 10 minutes away, one message tries
	// the endpoint at once (refused again, so the circuit stays open).
	// (Again if a probe in flight meanwhile scheduled the next one itself.)
	var clicked time.Time
	tenMinutes := regexp.MustCompile(`^in (9m 5\ds|10m 00s)$`)
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `UPDATE webhook_endpoints SET backoff_until = now() + interval '10 minutes'
			WHERE id = $1 RETURNING now()`, down.ID).Scan(&clicked))
		do(chromedp.Navigate(base+"/ops/endpoints/"+down.ID.String()), chromedp.WaitReady(chromedp.ID("next-probe")))
		return tenMinutes.MatchString(text("#next-probe"))
	}, 20*time.Second, 100*time.Millisecond, "the page never showed the next probe 10 minutes away")
	follow(t, bctx, chromedp.Click(chromedp.ID("probe")))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	page, err = chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, page, "Send one message to it now instead of at its next probe?")
	shot("14-confirm-probe.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	do(chromedp.WaitReady(chromedp.ID("endpoint-state")))
	require.Contains(t, text("p.notice"), "Probing now")
	require.Contains(t, a.log.String(), `"action":"probe_endpoint"`)
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
			WHERE m.destination = '`+down.ID.String()+`' AND a.finished_at > '`+clicked.Format(time.RFC3339Nano)+`'`) > 0
	}, 30*time.Second, 50*time.Millisecond, "Probe now did not probe the endpoint")

	// The search box: an order id leads to that order's deliveries.
	follow(t, bctx, chromedp.SendKeys(chromedp.ID("search"), orders[3]+"\n"))
	do(chromedp.WaitReady(chromedp.ID("messages")))
	page, err = chromedp.Run(bctx, chromedp.OuterHTML(chromedp.ID("messages")))
	require.NoError(t, err)
	require.Equal(t, 3, strings.Count(page, `<tr id="message-`), "placed to two endpoints, cancelled to one")
	shot("15-search-an-order.png")
}
