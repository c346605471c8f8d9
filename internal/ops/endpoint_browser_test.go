package ops_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// TestBrowserEndpointStoryAndActions walks an endpoint's life through the
// ops page in headless Chromium, scripts off, against the real api: create
// it from the form, find it by part of its URL, read its page while the
// relay is stalled (every number checked against the database), skip a
// failed message, then edit, pause, resume, retry its failed messages,
// rotate its secret, browse its messages with the list's filters and
// pages, discard what waits, and delete it. Each action asks first, changes the database only once
// confirmed, and is logged. No relay delivers meanwhile, so what the page
// shows stays what the test wrote; a wedged relay's row stands for a worker
// that is alive but claims nothing.
func TestBrowserEndpointStoryAndActions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	a := startAPI(t, ctx, nil)
	base, pool := a.base, a.pool
	b := browserPage{t, bctx}
	do, attr, html, shown := b.do, b.attr, b.html, b.number
	db := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	// confirm answers a confirmation page: it must have asked question,
	// and nothing may have changed yet (unchanged holds while it shows).
	confirm := func(question, name string, unchanged func() bool) {
		t.Helper()
		do(chromedp.WaitReady(chromedp.ID("confirm")))
		require.Contains(t, html("main"), question)
		require.True(t, unchanged(), "%s: the database changed before the confirmation", name)
		shot(name)
		follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	}
	logged := func(action string) {
		t.Helper()
		require.Contains(t, a.log.String(), `"action":"`+action+`"`)
	}

	// Sign in, and create the endpoint from the overview's form.
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, bctx, chromedp.Click(chromedp.ID("login")))
	follow(t, bctx, chromedp.Click(chromedp.ID("new-endpoint")))
	do(chromedp.WaitReady(chromedp.ID("save")),
		chromedp.SetValue(chromedp.ID("url"), "http://127.0.0.1:9/hooks/orders"),
		chromedp.SetValue(chromedp.ID("event_types"), "order.placed, order.cancelled"))
	shot("16-endpoint-form.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("save")))
	do(chromedp.WaitReady(chromedp.ID("secret")))
	secret, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID("secret")))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, "whsec_"), "the secret page shows %q", secret)
	var id uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM webhook_endpoints WHERE url = 'http://127.0.0.1:9/hooks/orders'
		AND event_types = '{order.cancelled,order.placed}'`).Scan(&id))
	logged("create_endpoint")
	shot("17-endpoint-created.png")
	self := "/ops/endpoints/" + id.String()

	// Its traffic: 55 orders (one is delivered, two failed after three
	// attempts, one is being sent, one waits for its retry in an hour), and
	// a wedged relay, alive but claiming nothing, while the oldest waiting
	// message has been due for 3 minutes.
	for i := range 55 {
		apiJSON[map[string]any](t, base, "POST", "/orders", map[string]any{"customer_id": fmt.Sprintf("c-%d", i),
			"lines": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 700}}})
	}
	var msgs []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM outbox_messages WHERE destination = $1 ORDER BY id`, id)
	require.NoError(t, err)
	for rows.Next() {
		var m uuid.UUID
		require.NoError(t, rows.Scan(&m))
		msgs = append(msgs, m)
	}
	require.NoError(t, rows.Err())
	require.Len(t, msgs, 55)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`UPDATE outbox_messages SET status = 'delivered', attempts = 1, delivered_at = now() WHERE id = $1`, msgs[0])
	exec(`INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
		VALUES ($1, 1, 'delivered', now() - interval '20 ms', now(), 204)`, msgs[0])
	failedIDs := []uuid.UUID{msgs[1], msgs[2]}
	exec(`UPDATE outbox_messages SET status = 'failed', attempts = 3, failed_at = now(),
		       last_error = 'attempt 3 of 3: 500 Internal Server Error: receiver down'
		WHERE id = ANY ($1::uuid[])`, failedIDs)
	exec(`INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
		SELECT m, n, CASE WHEN n = 3 THEN 'failed' ELSE 'retry' END, now() - interval '1 minute',
		       now() - interval '1 minute' + interval '9 ms', 500, '500 Internal Server Error: receiver down'
		FROM unnest($1::uuid[]) m, generate_series(1, 3) n`, failedIDs)
	exec(`UPDATE outbox_messages SET status = 'claimed', claimed_at = now(), claim_token = gen_random_uuid() WHERE id = $1`, msgs[3])
	exec(`UPDATE outbox_messages SET next_attempt_at = now() - interval '3 minutes', created_at = now() - interval '3 minutes' WHERE id = $1`, msgs[4])
	exec(`UPDATE outbox_messages SET attempts = 1, next_attempt_at = now() + interval '1 hour',
		last_error = 'attempt 1 of 8: 503 Service Unavailable' WHERE id = $1`, msgs[5])
	exec(`INSERT INTO outbox_relays (id, hostname, pid, last_claim_at, timeout_seconds)
		VALUES (gen_random_uuid(), 'wedged', 7, now() - interval '1 hour', 3600)`)
	deriveFromHistory(t, pool)

	// Find it by part of its URL: beside another endpoint under /hooks, a
	// list of both, from which it is one click away (a word that matches
	// nothing says so).
	apiJSON[admin.Endpoint](t, base, "POST", "/webhook-endpoints",
		map[string]any{"url": "http://127.0.0.1:9/hooks/billing", "event_types": []string{"order.cancelled"}})
	search := func(q string) {
		t.Helper()
		do(chromedp.SetValue(chromedp.ID("search"), q))
		follow(t, bctx, chromedp.SendKeys(chromedp.ID("search"), "\n"))
	}
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("search")))
	search("no-such-thing")
	do(chromedp.WaitReady(chromedp.ID("nothing-found")))
	shot("18-search-nothing-found.png")
	search("/hooks/")
	do(chromedp.WaitReady(chromedp.ID("endpoint-results")))
	require.Equal(t, 2, strings.Count(html("#endpoint-results"), "<li>"), "both endpoints under /hooks/")
	shot("19-search-endpoints.png")
	follow(t, bctx, chromedp.Click(chromedp.CSS(`#endpoint-results a[href="`+self+`"]`)))

	// Its page: the relay is stalled, so it says it is not delivering,
	// and every number is the database's.
	do(chromedp.WaitReady(chromedp.ID("endpoint-state")))
	require.Equal(t, outbox.HealthHealthy, attr("#endpoint-state", "data-state"))
	require.Contains(t, html("#endpoint-state"), "not delivering")
	require.Contains(t, html(".kpis"), "the relay is stalled")
	require.Equal(t, db(`SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status IN ('pending', 'claimed')`, id),
		shown("#endpoint-waiting"))
	require.Equal(t, int64(52), shown("#endpoint-waiting"), "55 less one delivered and two failed")
	require.Equal(t, db(`SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'failed'`, id), shown("#endpoint-failed"))
	require.Equal(t, int64(2), shown("#endpoint-failed"))
	hourly := `SELECT count(*) FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
		WHERE m.destination = $1 AND a.finished_at >= date_trunc('minute', now()) - interval '59 minutes'`
	require.Equal(t, strconv.FormatInt(db(hourly, id), 10), attr("#success-hour", "data-attempts"))
	require.Equal(t, strconv.FormatInt(db(hourly+` AND a.outcome = 'delivered'`, id), 10), attr("#success-hour", "data-delivered"))
	require.Contains(t, html("#success-hour"), "14.2%", "1 of 7 attempts delivered (rounded down)")
	require.Contains(t, html("#success-day"), "14.2%")
	require.Contains(t, html(".kpis"), "of 7", "the day's attempts")
	require.Regexp(t, `data-window="hour"><th scope="row">Last hour</th><td class="n">1</td><td class="n">20.0 ms</td>`, html("#latency"),
		"the one delivery, 20 ms: p50 exact within its bucket")
	daily := `SELECT count(*) FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
		WHERE m.destination = $1 AND a.finished_at >= now() - interval '1 day'`
	require.Equal(t, int(db(daily, id)), strings.Count(html("#attempts"), "data-outcome="), "every attempt of the day, newest first")
	require.Contains(t, html(".kpis"), "1 retrying on their own schedule")
	require.Contains(t, html("#attempts"), "receiver down")
	shot("20-endpoint-stalled.png")
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("relay")))
	require.Equal(t, admin.RelayStalled, attr("#relay", "data-state"))
	require.Equal(t, db(`SELECT count(*) FROM outbox_messages WHERE status = 'pending' AND NOT parked AND next_attempt_at <= now()`),
		shown("#due-count"))
	require.Contains(t, html("#endpoint-"+id.String()), "the relay is stalled")
	require.Equal(t, db(`SELECT count(*) FROM outbox_messages m JOIN webhook_endpoints e ON e.id = m.destination
		WHERE m.status = 'pending' AND NOT m.parked AND e.enabled AND (m.next_attempt_at > now() OR e.backoff_until > now())`),
		shown("#scheduled-count"))
	require.Equal(t, int64(1), shown("#scheduled-count"), "the retry in an hour")
	require.Equal(t, db(`SELECT count(*) FROM outbox_relays WHERE heartbeat_at >= now() - make_interval(secs => timeout_seconds)`),
		shown("#relays-alive"))
	shot("21-overview-stalled.png")

	// Skip one of the failed messages from its page: discarded, never sent.
	status := func(m uuid.UUID) func() string {
		return func() string {
			var st string
			require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE id = $1`, m).Scan(&st))
			return st
		}
	}
	do(chromedp.Navigate(base+"/ops/messages/"+msgs[1].String()), chromedp.WaitReady(chromedp.ID("skip")))
	follow(t, bctx, chromedp.Click(chromedp.ID("skip")))
	confirm("Skip this message?", "22-confirm-skip.png", func() bool { return status(msgs[1])() == outbox.StatusFailed })
	do(chromedp.WaitReady(chromedp.ID("message-status")))
	require.Equal(t, outbox.StatusDiscarded, attr("#message-status", "data-status"))
	require.Equal(t, outbox.StatusDiscarded, status(msgs[1])())
	logged("skip_message")

	// Edit: the form, the change reviewed, then made.
	do(chromedp.Navigate(base+self), chromedp.WaitReady(chromedp.ID("edit")))
	follow(t, bctx, chromedp.Click(chromedp.ID("edit")))
	do(chromedp.WaitReady(chromedp.ID("save")),
		chromedp.SetValue(chromedp.ID("url"), "http://127.0.0.1:9/hooks/orders/v2"),
		chromedp.SetValue(chromedp.ID("event_types"), "order.placed"))
	shot("23-endpoint-edit-form.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("save")))
	urlIs := func(u string) func() bool {
		return func() bool {
			return db(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND url = $2`, id, u) == 1
		}
	}
	confirm("Change this endpoint in place?", "24-confirm-edit.png", urlIs("http://127.0.0.1:9/hooks/orders"))
	do(chromedp.WaitReady(chromedp.ID("endpoint-url")))
	require.True(t, urlIs("http://127.0.0.1:9/hooks/orders/v2")())
	require.Equal(t, int64(1), db(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND event_types = '{order.placed}'`, id))
	require.Contains(t, html("main"), "http://127.0.0.1:9/hooks/orders/v2")
	logged("update_endpoint")

	// Pause, then resume.
	enabled := func(want bool) func() bool {
		return func() bool {
			return db(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND enabled = $2`, id, want) == 1
		}
	}
	follow(t, bctx, chromedp.Click(chromedp.ID("pause")))
	confirm("Pause deliveries to this endpoint?", "25-confirm-pause.png", enabled(true))
	do(chromedp.WaitReady(chromedp.ID("endpoint-state")))
	require.Equal(t, outbox.HealthPaused, attr("#endpoint-state", "data-state"))
	require.True(t, enabled(false)())
	shot("26-endpoint-paused.png")
	logged("disable_endpoint")
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("paused-waiting")))
	require.Equal(t, db(`SELECT count(*) FROM outbox_messages m JOIN webhook_endpoints e ON e.id = m.destination
		WHERE m.status = 'pending' AND NOT m.parked AND NOT e.enabled`), shown("#paused-waiting"))
	require.Equal(t, int64(51), shown("#paused-waiting"), "the endpoint's pending messages wait while it is paused")
	shot("27-overview-paused.png")
	do(chromedp.Navigate(base+self), chromedp.WaitReady(chromedp.ID("resume")))
	follow(t, bctx, chromedp.Click(chromedp.ID("resume")))
	confirm("Resume deliveries to this endpoint?", "28-confirm-resume.png", enabled(false))
	do(chromedp.WaitReady(chromedp.ID("endpoint-state")))
	require.True(t, enabled(true)())
	require.Equal(t, outbox.HealthHealthy, attr("#endpoint-state", "data-state"))
	logged("enable_endpoint")

	// Retry its failed messages: the one left.
	failed := func() int64 {
		return db(`SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'failed'`, id)
	}
	follow(t, bctx, chromedp.Click(chromedp.ID("retry-failed")))
	confirm("Send every failed message of this endpoint again?", "29-confirm-retry-all.png", func() bool { return failed() == 1 })
	do(chromedp.WaitReady(chromedp.ID("endpoint-failed")))
	require.Zero(t, failed())
	require.Zero(t, shown("#endpoint-failed"))
	require.Contains(t, html("p.notice"), "1 failed message requeued")
	logged("retry_failed_for_endpoint")

	// Rotate its secret: the new one is shown once, and the previous one
	// still signs for a day.
	rotated := func() bool {
		return db(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND previous_secret IS NOT NULL`, id) == 1
	}
	follow(t, bctx, chromedp.Click(chromedp.ID("rotate-secret")))
	confirm("Give this endpoint a new signing secret?", "30-confirm-rotate.png", func() bool { return !rotated() })
	do(chromedp.WaitReady(chromedp.ID("secret")))
	newSecret, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID("secret")))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(newSecret, "whsec_"))
	require.NotEqual(t, secret, newSecret)
	require.True(t, rotated())
	shot("31-secret-rotated.png")
	logged("rotate_secret")

	// The message list: its filters (failed is now empty; the endpoint's
	// 52 pending are a page of 50 and an older page), each message once.
	do(chromedp.Navigate(base+"/ops/messages"), chromedp.WaitReady(chromedp.ID("filters")),
		chromedp.SetValue(chromedp.ID("f-status"), "failed"))
	follow(t, bctx, chromedp.Click(chromedp.ID("apply")))
	do(chromedp.WaitReady(chromedp.ID("no-messages")))
	do(chromedp.SetValue(chromedp.ID("f-status"), "pending"), chromedp.SetValue(chromedp.ID("f-endpoint"), id.String()))
	follow(t, bctx, chromedp.Click(chromedp.ID("apply")))
	do(chromedp.WaitReady(chromedp.ID("messages")))
	rowID := regexp.MustCompile(`<tr id="message-([0-9a-f-]{36})" data-status="pending"`)
	seen := map[string]bool{}
	for _, m := range rowID.FindAllStringSubmatch(html("#messages"), -1) {
		seen[m[1]] = true
	}
	require.Len(t, seen, 50, "the first page")
	shot("32-messages-filtered.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("older")))
	do(chromedp.WaitReady(chromedp.ID("messages")))
	shot("33-messages-older.png")
	for _, m := range rowID.FindAllStringSubmatch(html("#messages"), -1) {
		require.False(t, seen[m[1]], "message %s on both pages", m[1])
		seen[m[1]] = true
	}
	pending := db(`SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending'`, id)
	require.Equal(t, int64(52), pending, "55 less the one delivered, the one skipped and the one being sent")
	require.Len(t, seen, int(pending), "the two pages hold every pending message of the endpoint")
	require.Regexp(t, `value="pending" selected`, html("#f-status"), "the filter is kept on the older page")

	// Discard what waits: the pending ones, not the one being sent.
	do(chromedp.Navigate(base+self), chromedp.WaitReady(chromedp.ID("discard-waiting")))
	follow(t, bctx, chromedp.Click(chromedp.ID("discard-waiting")))
	discarded := func() int64 {
		return db(`SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'discarded'`, id)
	}
	confirm("Discard the 52 messages waiting for this endpoint?", "34-confirm-discard.png", func() bool { return discarded() == 1 })
	do(chromedp.WaitReady(chromedp.ID("endpoint-waiting")))
	require.Equal(t, int64(53), discarded(), "the 52 waiting and the one skipped")
	require.Equal(t, db(`SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status IN ('pending', 'claimed')`, id),
		shown("#endpoint-waiting"))
	require.Equal(t, int64(1), shown("#endpoint-waiting"), "the one being sent")
	logged("discard_waiting")

	// Delete it: back to the overview, where it is gone.
	follow(t, bctx, chromedp.Click(chromedp.ID("delete")))
	exists := func() bool { return db(`SELECT count(*) FROM webhook_endpoints WHERE id = $1`, id) == 1 }
	confirm("Delete this endpoint for good?", "35-confirm-delete.png", exists)
	do(chromedp.WaitReady(chromedp.ID("relay")))
	require.False(t, exists())
	require.NotContains(t, html("main"), "http://127.0.0.1:9/hooks/orders/v2")
	logged("delete_endpoint")
	require.NotContains(t, a.log.String(), secret, "a secret is never logged")
	require.NotContains(t, a.log.String(), newSecret)

	// Sign out: the login form, and the ops page asks to sign in again
	// (TestLogoutEndsTheSessionInEveryProcess: even a copy of the cookie).
	follow(t, bctx, chromedp.Click(chromedp.ID("logout")))
	do(chromedp.WaitReady(chromedp.ID("token")))
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("token")))
	shot("36-signed-out.png")
}
