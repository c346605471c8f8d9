package ops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// chromiumPath finds the browser: CHROMIUM_PATH, else Debian's chromium
// (.ci/ensure-chromium installs it), else one on PATH.
func chromiumPath() string {
	for _, p := range []string{os.Getenv("CHROMIUM_PATH"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// screenshotDir is where the browser test leaves its screenshots for a
// person: OPS_SCREENSHOT_DIR, else <tmp>/ops-screenshots (kept after the
// test, unlike t.TempDir).
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("OPS_SCREENSHOT_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "ops-screenshots")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// TestBrowserRetryAFailedMessage drives the real api and a real relay from
// headless Chromium, with scripts disabled (the page must work without
// them): sign in, check the numbers against the database, open the failed
// message, fix the receiver, retry (and confirm), and watch it delivered.
func TestBrowserRetryAFailedMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// The receivers: one healthy, one down until the test fixes it.
	var down atomic.Bool
	down.Store(true)
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(healthy.Close)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if down.Load() {
			http.Error(w, "receiver down for maintenance", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(flaky.Close)

	// The real api, on a fresh database, and a real relay giving up after
	// two attempts.
	api := startAPI(t, ctx, nil)
	base, pool, apiLog := api.base, api.pool, api.log
	api.startRelay(t, ctx, relay.Config{
		PollInterval: 50 * time.Millisecond, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		DeliveryTimeout: 2 * time.Second, ClaimTimeout: time.Minute, MaxAttempts: 2,
	})

	// Endpoints and orders, through the api like any client.
	healthyEP := apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": healthy.URL + "/webhooks", "event_types": []string{"order.placed"}})
	flakyEP := apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": flaky.URL + "/webhooks/orders", "event_types": []string{"order.cancelled"}})
	seedHistory(t, pool, healthyEP.ID)
	var orderIDs []string
	for i := range 8 {
		o := apiJSON[struct {
			ID string `json:"id"`
		}](t, base, "POST", "/orders", map[string]any{"customer_id": fmt.Sprintf("c-%d", 100+i),
			"lines": []map[string]any{{"sku": "A-1", "quantity": i + 1, "unit_price_cents": 1250}, {"sku": "B-7", "quantity": 1, "unit_price_cents": 499}}})
		orderIDs = append(orderIDs, o.ID)
	}
	apiJSON[map[string]any](t, base, "POST", "/orders/"+orderIDs[2]+"/cancel", nil)

	var failedID uuid.UUID
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE destination = $1 AND status = 'failed'`, flakyEP.ID).Scan(&failedID)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "the cancellation never ended failed")
	require.Eventually(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'claimed')`) == 0
	}, 30*time.Second, 50*time.Millisecond, "the placed orders were never delivered")

	// The browser, scripts off: everything below works with forms and links alone.
	bctx, shot := headless(t, ctx, false)
	b := browserPage{t, bctx}
	do := b.do
	// number reads a KPI by its id (browserPage.number).
	number := func(id string) int64 { t.Helper(); return b.number("#" + id) }

	// Sign in through the form.
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("token")))
	shot("01-login.png")
	do(chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, bctx, chromedp.Click(chromedp.ID("login")))
	do(chromedp.WaitReady(chromedp.ID("pending-count")))

	// The numbers are the database's.
	require.Equal(t, count(t, pool, `SELECT count(*) FROM outbox_messages WHERE status = 'pending'`), number("pending-count"))
	require.Equal(t, int64(1), number("failed-count"))
	require.Equal(t, count(t, pool, `SELECT count(*) FROM outbox_messages WHERE status = 'failed'`), number("failed-count"))
	require.Equal(t, count(t, pool, `SELECT count(*) FROM outbox_attempts WHERE outcome = 'delivered' AND finished_at >= now() - interval '1 hour'`),
		number("delivered-60m"))
	do(chromedp.WaitReady(chromedp.ID("failed-" + failedID.String())))
	shot("02-overview-failed.png")

	// The failed message's page: its error and attempts.
	follow(t, bctx, chromedp.Click(chromedp.CSS(`#failed-`+failedID.String()+` a`)))
	do(chromedp.WaitReady(chromedp.ID("message-status")))
	attrs, err := chromedp.Run(bctx, chromedp.Attributes(chromedp.ID("message-status")))
	require.NoError(t, err)
	require.Equal(t, "failed", attrs["data-status"])
	page, err := chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, page, "receiver down for maintenance")
	require.Contains(t, page, orderIDs[2], "the payload is the cancelled order")
	require.Equal(t, 2, strings.Count(page, `data-outcome=`))
	// The receiver sees the event id (webhook-id, the body's id), not the
	// message's; the cancellation is keyed by its order, so it holds the key.
	var eventID uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id FROM outbox_messages WHERE id = $1`, failedID).Scan(&eventID))
	require.Contains(t, page, `id="event-id">`+eventID.String()+`<`)
	require.Contains(t, page, `webhook-id</th><td><span class="mono">`+eventID.String()+`</span>`)
	require.Contains(t, page, `id="ordering-key">`+orderIDs[2]+`<`)
	require.Contains(t, page, "It holds its ordering key.")
	require.Contains(t, page, `id="skip"`)
	shot("03-message-failed.png")

	// Fix the receiver, then Retry from the overview, and confirm.
	down.Store(false)
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("failed-"+failedID.String())))
	follow(t, bctx, chromedp.Click(chromedp.CSS(`#failed-`+failedID.String()+` button`)))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	shot("04-confirm-retry.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	do(chromedp.WaitReady(chromedp.ID("pending-count")))

	// Reload until the page shows it delivered.
	deadline := time.Now().Add(30 * time.Second)
	for number("failed-count") != 0 {
		require.True(t, time.Now().Before(deadline), "the retried message never left failed on the page")
		time.Sleep(200 * time.Millisecond)
		do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("failed-count")))
	}
	for {
		do(chromedp.Navigate(base+"/ops/messages/"+failedID.String()), chromedp.WaitReady(chromedp.ID("message-status")))
		attrs, err := chromedp.Run(bctx, chromedp.Attributes(chromedp.ID("message-status")))
		require.NoError(t, err)
		if attrs["data-status"] == outbox.StatusDelivered {
			break
		}
		require.True(t, time.Now().Before(deadline), "the retried message never showed delivered")
		time.Sleep(200 * time.Millisecond)
	}
	page, err = chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Equal(t, 3, strings.Count(page, `data-outcome=`), "two failed attempts, then the delivery after the retry")
	require.Contains(t, page, `data-outcome="delivered"`)
	shot("05-message-delivered.png")
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE id = $1`, failedID).Scan(&status))
	require.Equal(t, outbox.StatusDelivered, status)
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("pending-count")))
	require.Equal(t, int64(0), number("failed-count"))
	require.Equal(t, count(t, pool, `SELECT count(*) FROM outbox_messages WHERE status = 'pending'`), number("pending-count"))
	attrs, err = chromedp.Run(bctx, chromedp.Attributes(chromedp.ID("endpoint-"+flakyEP.ID.String())))
	require.NoError(t, err)
	require.Equal(t, outbox.HealthHealthy, attrs["data-health"], "the fixed endpoint delivers again")
	shot("06-overview-after-retry.png")

	// Replay the endpoint's last hour from its row: the form is prefilled
	// (UTC), the confirmation counts the one cancellation, and replaying
	// gives it a new message under the same event id.
	do(chromedp.Click(chromedp.CSS(`#replay-`+flakyEP.ID.String()+` summary`)),
		chromedp.WaitVisible(chromedp.ID("replay-submit-"+flakyEP.ID.String())))
	shot("07-replay-form.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("replay-submit-"+flakyEP.ID.String())))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	page, err = chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, page, "Re-send 1 event to this endpoint?")
	shot("08-confirm-replay.png")
	// The answer is the overview with a notice.
	follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	do(chromedp.WaitVisible(chromedp.CSS("p.notice")))
	page, err = chromedp.Run(bctx, chromedp.OuterHTML(chromedp.CSS("p.notice")))
	require.NoError(t, err)
	require.Contains(t, page, "Replayed 1 event (0 already waiting were skipped).")
	require.Equal(t, int64(2), count(t, pool, `SELECT count(*) FROM outbox_messages WHERE event_id = '`+eventID.String()+`'`))
	require.Contains(t, apiLog.String(), `"action":"replay_endpoint"`)
	// The endpoint's replay page: the same form, with room to explain.
	do(chromedp.Navigate(base+"/ops/endpoints/"+flakyEP.ID.String()+"/replay"),
		chromedp.WaitVisible(chromedp.ID("replay-submit-"+flakyEP.ID.String())))
	shot("09-replay-page.png")

	require.Contains(t, apiLog.String(), `"action":"retry_message"`)
	require.NotContains(t, apiLog.String(), token)
}

func waitHealthy(t *testing.T, base string) {
	t.Helper()
	require.Eventually(t, func() bool {
		res, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond, "the api never became healthy")
}

// apiJSON calls the api as an admin client and decodes its 2xx answer.
func apiJSON[T any](t *testing.T, base, method, path string, body any) T {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	require.Less(t, res.StatusCode, 300, "%s %s: %s", method, path, raw)
	var v T
	require.NoError(t, json.Unmarshal(raw, &v))
	return v
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// seedHistory writes an hour of past traffic for endpoint, so the charts in
// the screenshots have something to show: steady deliveries, and a seven
// minute outage half an hour ago whose messages were retried and delivered
// when it ended. Everything is delivered, so today's numbers are untouched.
// Each is an event (outbox_events, with the payload) and its one delivery,
// whose id shares the event's time prefix, as Enqueue writes them.
func seedHistory(t *testing.T, pool *pgxpool.Pool, endpoint uuid.UUID) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
WITH plan AS MATERIALIZED (
    SELECT k, i, outbox_uuid_v7_at(created) AS event_id, created, outage
    FROM (
        SELECT k, i,
               now() - make_interval(mins => k) + make_interval(secs => (i * 37 + k * 11) % 60) AS created,
               k BETWEEN 29 AND 35 AS outage
        FROM generate_series(3, 59) k,
             LATERAL generate_series(1, 14 + (k * 7) % 9 + CASE WHEN k BETWEEN 40 AND 48 THEN 8 ELSE 0 END) i
    ) p
), events AS (
    INSERT INTO outbox_events (id, type, payload, created_at)
    SELECT event_id, 'order.placed', json_build_object('seeded', true, 'minute', k, 'n', i), created
    FROM plan
), msgs AS (
    INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, created_at, next_attempt_at, delivered_at)
    SELECT outbox_uuid_sibling(event_id), event_id, 'order.placed', $1, 'delivered',
           CASE WHEN outage THEN 2 ELSE 1 END, created, created,
           CASE WHEN outage THEN now() - interval '28 minutes' + make_interval(secs => (i * 13 + k) % 110)
                ELSE created + interval '180 ms' END
    FROM plan
    RETURNING id, attempts, created_at, delivered_at
)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
SELECT id, 1, 'retry', created_at + interval '150 ms', created_at + interval '2150 ms', NULL,
       'context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
FROM msgs WHERE attempts = 2
UNION ALL
SELECT id, attempts, 'delivered', delivered_at - interval '35 ms', delivered_at, 204, NULL
FROM msgs`, endpoint)
	require.NoError(t, err)
	deriveFromHistory(t, pool)
}
