package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestBrowserMessageListFiltersAndPages drives the message list's filter
// form in headless Chromium, scripts off: by status, type, endpoint,
// ordering key, event id, a window of time and several at once. For each,
// the list's pages, followed from the newest through Older to the last, hold
// exactly the database's matching messages, newest first, each once; the
// browser's Back returns to each page before, as Newer does from the last
// page, and Newest goes to the first.
func TestBrowserMessageListFiltersAndPages(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	e := newEnv(t, token)
	base := e.srv.URL
	b := browserPage{t, bctx}
	do := b.do

	// Three hours of events, of two types and three ordering keys, to
	// endpoint a (every type) and b (order.placed), in every status.
	epA := e.endpoint(t, "http://127.0.0.1:9/list/a", "order.placed", "order.cancelled")
	epB := e.endpoint(t, "http://127.0.0.1:9/list/b", "order.placed")
	e.exec(t, `
WITH plan AS MATERIALIZED (
    SELECT g, now() - make_interval(secs => g * 83) AS created,
           CASE WHEN g % 3 = 0 THEN 'order.cancelled' ELSE 'order.placed' END AS type,
           'order-' || (g % 3) AS key
    FROM generate_series(1, 130) g
), ev AS (
    INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
    SELECT outbox_uuid_v7_at(created), type, json_build_object('n', g), key, created FROM plan
    RETURNING id, type, ordering_key, created_at
), dest AS (
    SELECT ev.*, d.id AS destination, (row_number() OVER (ORDER BY ev.id, d.id)) % 5 AS s
    FROM ev JOIN webhook_endpoints d ON ev.type = ANY (d.event_types)
)
INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, status, attempts, created_at, next_attempt_at,
                             delivered_at, failed_at, discarded_at, last_error)
SELECT outbox_uuid_sibling(id), id, type, destination, ordering_key,
       (ARRAY['pending', 'delivered', 'failed', 'discarded', 'pending'])[s + 1],
       CASE s WHEN 1 THEN 1 WHEN 2 THEN 3 ELSE 0 END, created_at, created_at,
       CASE WHEN s = 1 THEN created_at + interval '40 ms' END,
       CASE WHEN s = 2 THEN created_at + interval '2 minutes' END,
       CASE WHEN s = 3 THEN created_at + interval '3 minutes' END,
       CASE WHEN s = 2 THEN 'attempt 3 of 3: 500 Internal Server Error' END
FROM dest`)
	total := e.count(t, `SELECT count(*) FROM outbox_messages`)

	// walk reads every page of the list the browser is on, following Older
	// to the last, and checks the way back: Back to each page before, then
	// Newest to the first. It returns the pages' ids, in order.
	walk := func(name string) ([]string, int) {
		t.Helper()
		var pages [][]string
		for {
			pages = append(pages, b.listed())
			if len(pages) == 2 {
				shot(name + "-older.png")
			}
			if !b.exists("#older") {
				break
			}
			follow(t, bctx, chromedp.Click(chromedp.ID("older")))
			do(chromedp.WaitReady(chromedp.ID("filters")))
			require.True(t, b.exists("#newest"), "an older page links back to the newest")
		}
		if len(pages) > 1 {
			// Back, page by page, to the first; then Older and Newest.
			for i := len(pages) - 2; i >= 0; i-- {
				do(chromedp.NavigateBack(), chromedp.WaitReady(chromedp.ID("filters")))
				require.Equal(t, pages[i], b.listed(), "Back shows the page before, unchanged")
			}
			// Older to the last page again, then Newer, page by page, to
			// the first, which has no Newer.
			for i := 1; i < len(pages); i++ {
				follow(t, bctx, chromedp.Click(chromedp.ID("older")))
				do(chromedp.WaitReady(chromedp.ID("newest")))
				require.Equal(t, pages[i], b.listed(), "Older shows the next page again")
			}
			for i := len(pages) - 2; i >= 0; i-- {
				follow(t, bctx, chromedp.Click(chromedp.ID("newer")))
				do(chromedp.WaitReady(chromedp.ID("filters")))
				require.Equal(t, pages[i], b.listed(), "Newer shows the page before")
				if i == 1 {
					shot(name + "-newer.png")
				}
			}
			require.False(t, b.exists("#newer"), "the first page has nothing newer")
			require.False(t, b.exists("#newest"), "Newer reached the first page")
			// Newest, from an older page.
			follow(t, bctx, chromedp.Click(chromedp.ID("older")))
			do(chromedp.WaitReady(chromedp.ID("newest")))
			follow(t, bctx, chromedp.Click(chromedp.ID("newest")))
			do(chromedp.WaitReady(chromedp.ID("filters")))
			require.Equal(t, pages[0], b.listed(), "Newest shows the first page again")
		}
		var all []string
		seen := map[string]bool{}
		for _, p := range pages {
			for _, id := range p {
				require.False(t, seen[id], "message %s is on two pages", id)
				seen[id] = true
			}
			all = append(all, p...)
		}
		return all, len(pages)
	}
	// filter fills the form from an empty list, submits it, and checks
	// every page against the database's rows in order.
	filter := func(name string, fields map[string]string, want []string) (pages int) {
		t.Helper()
		require.NotEmpty(t, want, "%s: the seeded messages include some that match", name)
		require.Less(t, int64(len(want)), total, "%s: the filter leaves some out", name)
		do(chromedp.Navigate(base+"/ops/messages"), chromedp.WaitReady(chromedp.ID("filters")))
		for id, v := range fields {
			do(chromedp.SetValue(chromedp.ID(id), v))
		}
		follow(t, bctx, chromedp.Click(chromedp.ID("apply")))
		do(chromedp.WaitReady(chromedp.ID("filters")))
		require.False(t, b.exists("#filter-error"), "%s: the form's values are read", name)
		for id, v := range fields {
			require.Equal(t, v, b.attr("#"+id+` `+selectedOr(id), "value"), "%s: the form keeps %s", name, id)
		}
		shot(name + ".png")
		got, pages := walk(name)
		require.Equal(t, want, got, "%s: the list's pages hold the database's matching messages, newest first", name)
		return pages
	}

	signIn(t, b, base)

	// No filter: every message, over several pages.
	do(chromedp.Navigate(base+"/ops/messages"), chromedp.WaitReady(chromedp.ID("filters")))
	all := ids(t, e.pool, `SELECT id FROM outbox_messages ORDER BY id DESC`)
	got, pages := walk("50-messages-all")
	require.Equal(t, all, got, "the unfiltered pages hold every message, newest first")
	require.Greater(t, pages, 2, "the messages fill more than two pages, so some page is neither first nor last")

	filter("51-messages-failed", map[string]string{"f-status": "failed"},
		ids(t, e.pool, `SELECT id FROM outbox_messages WHERE status = 'failed' ORDER BY id DESC`))
	filter("52-messages-cancelled", map[string]string{"f-type": "order.cancelled"},
		ids(t, e.pool, `SELECT id FROM outbox_messages WHERE type = 'order.cancelled' ORDER BY id DESC`))
	filter("53-messages-endpoint", map[string]string{"f-endpoint": epB.ID.String()},
		ids(t, e.pool, `SELECT id FROM outbox_messages WHERE destination = $1 ORDER BY id DESC`, epB.ID))
	pages = filter("54-messages-key", map[string]string{"f-key": "order-1"},
		ids(t, e.pool, `SELECT id FROM outbox_messages WHERE ordering_key = 'order-1' ORDER BY id DESC`))
	require.Greater(t, pages, 1, "a key's messages fill more than a page: its pages are read by key too")
	event := ids(t, e.pool, `SELECT event_id FROM outbox_messages WHERE destination = $1 ORDER BY id LIMIT 1`, epB.ID)[0]
	filter("55-messages-event", map[string]string{"f-event": event},
		ids(t, e.pool, `SELECT id FROM outbox_messages WHERE event_id = $1 ORDER BY id DESC`, event))
	// A window of event time, in whole minutes (UTC): from included, to not.
	now := time.Now().UTC().Truncate(time.Minute)
	from, to := now.Add(-100*time.Minute), now.Add(-40*time.Minute)
	filter("56-messages-window", map[string]string{"f-from": minute(from), "f-to": minute(to)},
		ids(t, e.pool, `SELECT m.id FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id
			WHERE ev.created_at >= $1 AND ev.created_at < $2 ORDER BY m.id DESC`, from, to))
	filter("57-messages-combined", map[string]string{"f-status": "pending", "f-endpoint": epA.ID.String(), "f-type": "order.placed"},
		ids(t, e.pool, `SELECT id FROM outbox_messages WHERE status = 'pending' AND destination = $1 AND type = 'order.placed'
			ORDER BY id DESC`, epA.ID))
}

// selectedOr is the part of a selector that finds a form field's current
// value: a select's chosen option, else the input itself.
func selectedOr(id string) string {
	switch id {
	case "f-status", "f-endpoint":
		return "option[selected]"
	}
	return ""
}
