package ops_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox"
)

// The search box goes where whatever an operator pasted leads: a message id
// to its page, an event id (webhook-id) to its deliveries, an order id (an
// ordering key) to its events' deliveries, an endpoint id or part of its URL
// to its page; an event with no subscriber is said to be recorded; anything
// else says what was looked for.
func TestSearchFindsMessagesEventsOrdersAndEndpoints(t *testing.T) {
	t.Parallel()
	// A module's lookup, as the orders module's is wired in the api: it
	// knows one entity, whose events carry its id as their key.
	entity := uuid.New()
	e := newEnv(t, token, func(o *ops.Options) {
		o.Lookups = []ops.Lookup{func(_ context.Context, q string) (ops.Found, bool, error) {
			if q != entity.String() {
				return ops.Found{}, false, nil
			}
			return ops.Found{Key: "entity-" + q}, true, nil
		}}
	})
	c := e.loggedIn(t)
	billing := e.endpoint(t, "http://127.0.0.1:9/billing", "order.placed", "order.cancelled", "order.shipped")
	e.endpoint(t, "http://127.0.0.1:9/shipping", "order.placed")
	// The entity was placed three days ago and cancelled two days ago; a
	// module's later event about it is written now: its events are found
	// whatever their time.
	e.enqueueKeyedAt(t, "order.placed", "entity-"+entity.String(), time.Now().Add(-72*time.Hour))
	e.enqueueKeyedAt(t, "order.cancelled", "entity-"+entity.String(), time.Now().Add(-48*time.Hour))
	e.enqueueKeyed(t, "order.shipped", "entity-"+entity.String(), map[string]string{"id": entity.String()})
	order := "invoice-" + uuid.NewString()[:8]
	placed := e.enqueueKeyed(t, "order.placed", order, map[string]string{"id": order})
	cancelled := e.enqueueKeyed(t, "order.cancelled", order, map[string]string{"id": order})
	other := e.enqueueKeyed(t, "order.placed", uuid.NewString(), map[string]string{"id": "other"})
	require.Len(t, placed, 2, "two endpoints take order.placed")
	require.Len(t, cancelled, 1)

	search := func(q string) (*http.Response, string) {
		return get(t, c, e.srv.URL+"/ops/search?"+url.Values{"q": {q}}.Encode())
	}
	redirect := func(q, want string) {
		t.Helper()
		res, _ := search(q)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "q=%s", q)
		require.Equal(t, want, res.Header.Get("Location"), "q=%s", q)
	}
	redirect(placed[1].String(), "/ops/messages/"+placed[1].String())
	redirect("  "+placed[1].String()+" ", "/ops/messages/"+placed[1].String())
	redirect(e.eventOf(t, placed[0]).String(), "/ops/messages?event="+e.eventOf(t, placed[0]).String())
	// A key no module knows: its events, whatever their time.
	res, _ := search(order)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	loc, err := url.Parse(res.Header.Get("Location"))
	require.NoError(t, err)
	require.Equal(t, "/ops/messages", loc.Path)
	require.Equal(t, url.Values{"key": {order}}, loc.Query(), "no window of time bounds a key's events")
	redirect(billing.ID.String(), "/ops/endpoints/"+billing.ID.String())
	redirect("BILLING", "/ops/endpoints/"+billing.ID.String())

	// The key's page lists its three deliveries, and nothing else.
	_, body := get(t, c, e.srv.URL+loc.String())
	require.Equal(t, 3, strings.Count(body, `<tr id="message-`), body)
	for _, id := range append(placed, cancelled...) {
		require.Contains(t, body, `id="message-`+id.String()+`"`)
	}
	require.NotContains(t, body, other[0].String())
	// The ids on the list end with their random part: two deliveries of one
	// event written in the same instant still read apart.
	require.Contains(t, body, "…"+placed[0].String()[24:])
	require.Contains(t, body, "…"+placed[1].String()[24:])
	require.NotEqual(t, placed[0].String()[24:], placed[1].String()[24:])

	// The module's entity: every event of its key, days apart.
	res, body = search(entity.String())
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	loc, err = url.Parse(res.Header.Get("Location"))
	require.NoError(t, err)
	require.Equal(t, "entity-"+entity.String(), loc.Query().Get("key"))
	_, body = get(t, c, e.srv.URL+loc.String())
	require.Equal(t, 4, strings.Count(body, `<tr id="message-`), "placed and cancelled days ago, shipped now: %s", loc)
	for typ, n := range map[string]int{"order.placed": 2, "order.cancelled": 1, "order.shipped": 1} {
		require.Equal(t, n, strings.Count(body, ">"+typ+"<"), "the entity's %s is listed, to each endpoint it went to", typ)
	}

	// An event nobody subscribed to is recorded all the same.
	var lonely uuid.UUID
	require.NoError(t, pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) (err error) {
		lonely, err = outbox.Enqueue(context.Background(), tx, outbox.Event{Type: "order.refunded", Data: map[string]int{"n": 1}})
		return err
	}))
	res, body = search(lonely.String())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="event-found"`)
	require.Contains(t, body, "no endpoint was subscribed")

	// Two endpoints match "127.0.0.1": a list of both.
	res, body = search("127.0.0.1")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, 2, strings.Count(body, `<li><a href="/ops/endpoints/`))

	res, body = search(uuid.NewString())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="nothing-found"`)
	// A key that is a UUID no module knows is found as a key too: the
	// key's index reads a few pages for it, there or not.
	uuidKey := uuid.NewString()
	e.enqueueKeyed(t, "order.placed", uuidKey, map[string]string{"id": uuidKey})
	redirect(uuidKey, "/ops/messages?"+url.Values{"key": {uuidKey}}.Encode())
	res, body = search("no-such-thing")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="nothing-found"`)
}

// enqueueKeyedAt records an event of key written at, and its delivery to
// each endpoint subscribed to typ, delivered then: what Enqueue and the
// relay would have written at that time.
func (e *env) enqueueKeyedAt(t *testing.T, typ, key string, at time.Time) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
			VALUES (outbox_uuid_v7_at($3), $1, '{}', $2, $3)
			RETURNING id, type, ordering_key, created_at
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, status, attempts, delivered_at, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, w.id, ev.ordering_key, 'delivered', 1, ev.created_at, ev.created_at, ev.created_at
		FROM ev JOIN webhook_endpoints w ON w.event_types @> ARRAY[ev.type]`, typ, key, at)
	require.NoError(t, err)
}

var messageRowRe = regexp.MustCompile(`<tr id="message-([0-9a-f-]{36})" data-status="(\w+)">`)

// The list filters by status, type, endpoint and time, and pages through
// everything once, newest first, with the filter kept on every page.
func TestMessageListFiltersAndPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed", "order.cancelled")
	b := e.endpoint(t, "http://127.0.0.1:9/b", "order.placed")
	var forA []uuid.UUID
	for i := range 120 {
		typ := "order.placed"
		if i%3 == 0 {
			typ = "order.cancelled"
		}
		ev := e.eventOf(t, e.enqueue(t, typ, map[string]int{"i": i})[0])
		var id uuid.UUID
		require.NoError(t, e.pool.QueryRow(context.Background(),
			`SELECT id FROM outbox_messages WHERE event_id = $1 AND destination = $2`, ev, a.ID).Scan(&id))
		forA = append(forA, id)
	}
	e.fail(t, forA[5])
	e.fail(t, forA[77])

	// Every message of endpoint a, page by page: 120 of them, each once, in
	// newest-first order, and none of b's.
	next := e.srv.URL + "/ops/messages?endpoint=" + a.ID.String()
	var seen []string
	pages := 0
	for next != "" {
		res, body := get(t, c, next)
		require.Equal(t, http.StatusOK, res.StatusCode)
		pages++
		for _, m := range messageRowRe.FindAllStringSubmatch(body, -1) {
			seen = append(seen, m[1])
		}
		require.NotContains(t, body, "/ops/endpoints/"+b.ID.String()+`">`, "a message of endpoint b")
		next = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="older"`).FindStringSubmatch(body); m != nil {
			u, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
			require.NoError(t, err)
			require.Equal(t, a.ID.String(), u.Query().Get("endpoint"), "the next page keeps the filter")
			next = e.srv.URL + u.String()
		}
	}
	require.Equal(t, 3, pages, "50 + 50 + 20")
	require.Len(t, seen, 120)
	for i, id := range seen {
		require.Equal(t, forA[len(forA)-1-i].String(), id, "newest first, each once")
	}

	// Failed only: the two.
	_, body := get(t, c, e.srv.URL+"/ops/messages?status=failed")
	rows := messageRowRe.FindAllStringSubmatch(body, -1)
	require.Len(t, rows, 2)
	require.Equal(t, forA[77].String(), rows[0][1])
	require.Equal(t, forA[5].String(), rows[1][1])

	// By type, across both endpoints: 40 cancellations, all for a.
	n := 0
	next = e.srv.URL + "/ops/messages?type=order.cancelled"
	for next != "" {
		_, body := get(t, c, next)
		for _, m := range messageRowRe.FindAllStringSubmatch(body, -1) {
			require.Contains(t, body, `id="message-`+m[1])
			n++
		}
		next = ""
		if m := regexp.MustCompile(`href="([^"]+)" id="older"`).FindStringSubmatch(body); m != nil {
			next = e.srv.URL + strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	require.Equal(t, 40, n)

	// A time range that ends before everything: nothing.
	_, body = get(t, c, e.srv.URL+"/ops/messages?to=2001-01-01T00:00")
	require.Contains(t, body, `id="no-messages"`)

	// Bad filters are a clear 400.
	for _, q := range []string{"status=lost", "endpoint=nope", "from=yesterday", "before=x", "after=x"} {
		res, body := get(t, c, e.srv.URL+"/ops/messages?"+q)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, q)
		require.Contains(t, body, `id="filter-error"`, q)
	}
}

// A search or a filter that is not text (a NUL byte, invalid UTF-8) names
// nothing stored: the page says so with a 400, never a 500.
func TestSearchAndFiltersThatAreNotTextAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	for _, path := range []string{"/ops/search?q=%ff", "/ops/search?q=a%00", "/ops/messages?type=%ff", "/ops/messages?key=%00"} {
		res, _ := get(t, c, e.srv.URL+path)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, path)
	}
}

// A list that ends exactly at a page's end offers no older page: before,
// 50 messages showed an "Older" link to an empty page.
func TestMessageListEndingAtAPageEndHasNoOlderPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	ep := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	const pageSize = 50 // a list page's
	for i := range pageSize {
		e.enqueue(t, "order.placed", map[string]int{"i": i})
	}
	res, body := get(t, c, e.srv.URL+"/ops/messages?endpoint="+ep.ID.String())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Len(t, messageRowRe.FindAllStringSubmatch(body, -1), pageSize, "the whole list on one page")
	require.NotContains(t, body, `id="older"`, "nothing older to show")

	e.enqueue(t, "order.placed", map[string]int{"i": pageSize})
	_, body = get(t, c, e.srv.URL+"/ops/messages?endpoint="+ep.ID.String())
	require.Contains(t, body, `id="older"`, "one more message: an older page")
}
