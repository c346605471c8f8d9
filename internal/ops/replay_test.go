package ops_test

import (
	"context"
	"html"
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
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// minute is a datetime-local input's value, in UTC.
func minute(t time.Time) string { return t.UTC().Format("2006-01-02T15:04") }

var hiddenRe = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// hiddenFields reads a confirmation page's form, as the browser would post it.
func hiddenFields(body string) url.Values {
	v := url.Values{}
	for _, m := range hiddenRe.FindAllStringSubmatch(body, -1) {
		if m[1] == "csrf" && v.Has("csrf") {
			continue // the sign-out form's
		}
		v.Add(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
	}
	return v
}

// messagesOf lists the statuses of an endpoint's messages of one event,
// oldest first.
func (e *env) messagesOf(t *testing.T, endpoint, event uuid.UUID) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT status FROM outbox_messages WHERE destination = $1 AND event_id = $2 ORDER BY created_at, id`, endpoint, event)
	require.NoError(t, err)
	st, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return st
}

func TestReplayConfirmsTheCountThenResendsUnderTheOriginalEventIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed", "order.cancelled")
	b := e.endpoint(t, "http://127.0.0.1:9/b", "order.placed")
	// An event from before the range.
	e.exec(t, `INSERT INTO outbox_events (id, type, payload, created_at)
		VALUES (outbox_uuid_v7_at(now() - interval '2 hours'), 'order.placed', '{"old": true}', now() - interval '2 hours')`)
	var placed []uuid.UUID // events
	var toA []uuid.UUID    // their messages to a
	for i := range 3 {
		for _, id := range e.enqueue(t, "order.placed", map[string]int{"n": i}) {
			var dest uuid.UUID
			require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT destination FROM outbox_messages WHERE id = $1`, id).Scan(&dest))
			if dest == a.ID {
				toA = append(toA, id)
				placed = append(placed, e.eventOf(t, id))
			}
		}
	}
	cancelled := e.enqueue(t, "order.cancelled", map[string]int{"n": 9})[0]
	// a got the first two and the cancellation; the third still waits.
	e.deliver(t, toA[0], time.Minute)
	e.deliver(t, toA[1], time.Minute)
	e.deliver(t, cancelled, time.Minute)
	before := e.count(t, `SELECT count(*) FROM outbox_messages`)
	ofB := e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, b.ID)

	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	replay := e.srv.URL + "/ops/endpoints/" + a.ID.String() + "/replay"

	// The overview's endpoint row has the form: UTC times and a's types.
	_, body := get(t, c, e.srv.URL+"/ops")
	row := body[strings.Index(body, `id="endpoint-`+a.ID.String()+`"`):]
	row = row[:strings.Index(row, "</tr>")]
	require.Contains(t, row, `action="/ops/endpoints/`+a.ID.String()+`/replay"`)
	require.Contains(t, row, `type="datetime-local" id="replay-from-`+a.ID.String()+`" name="from"`)
	require.Contains(t, row, `name="to"`)
	require.Contains(t, row, "UTC")
	require.Contains(t, row, `name="type" value="order.cancelled" checked`)
	require.Contains(t, row, `name="type" value="order.placed" checked`)
	// And so does its own page.
	res, page := get(t, c, replay)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, `action="/ops/endpoints/`+a.ID.String()+`/replay"`)
	require.Contains(t, page, a.URL)

	now := time.Now()
	form := url.Values{"csrf": {csrf}, "from": {minute(now.Add(-30 * time.Minute))}, "to": {minute(now.Add(2 * time.Minute))},
		"type": {"order.placed"}, "return": {"/ops"}}

	// First step: how many events it will re-send, and nothing written.
	res, page = postPage(t, c, replay, form)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, "Re-send 3 events to this endpoint?")
	require.Contains(t, page, "<dt>Events in the range</dt><dd>3</dd>")
	require.Contains(t, page, a.URL)
	require.Contains(t, page, minute(now.Add(-30 * time.Minute))[11:]+":00 UTC (included)")
	require.Contains(t, page, "skipped, not sent twice")
	require.Equal(t, before, e.count(t, `SELECT count(*) FROM outbox_messages`))
	step2 := hiddenFields(page)
	require.Equal(t, "yes", step2.Get("confirm"))
	require.Equal(t, []string{"order.placed"}, step2["type"])
	require.Equal(t, csrf, step2.Get("csrf"))

	// Second step: the two delivered events get a new message each, under
	// their event ids; the one still waiting is skipped; nothing else moves.
	res = post(t, c, replay, step2)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=replayed&m=1&n=2", res.Header.Get("Location"))
	require.Equal(t, []string{outbox.StatusDelivered, outbox.StatusPending}, e.messagesOf(t, a.ID, placed[0]))
	require.Equal(t, []string{outbox.StatusDelivered, outbox.StatusPending}, e.messagesOf(t, a.ID, placed[1]))
	require.Equal(t, []string{outbox.StatusPending}, e.messagesOf(t, a.ID, placed[2]), "already waiting: not duplicated")
	require.Equal(t, []string{outbox.StatusDelivered}, e.messagesOf(t, a.ID, e.eventOf(t, cancelled)), "a type not chosen")
	require.Equal(t, before+2, e.count(t, `SELECT count(*) FROM outbox_messages`))
	require.Equal(t, ofB, e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, b.ID))
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id
		WHERE ev.created_at < now() - interval '1 hour'`), "the old event is out of the range")
	// The new message's page and body carry the original event id.
	var replayed uuid.UUID
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT id FROM outbox_messages WHERE destination = $1 AND event_id = $2 AND status = 'pending'`, a.ID, placed[0]).Scan(&replayed))
	require.NotEqual(t, toA[0], replayed)
	_, page = get(t, c, e.srv.URL+"/ops/messages/"+replayed.String())
	require.Contains(t, page, `&#34;id&#34;: &#34;`+placed[0].String()+`&#34;`)
	require.Contains(t, page, "this delivery is a replay")

	_, body = get(t, c, e.srv.URL+"/ops?done=replayed&m=1&n=2")
	require.Contains(t, body, "Replayed 2 events (1 already waiting was skipped).")
	logs := e.logs.String()
	require.Contains(t, logs, `"action":"replay_endpoint","auth":"cookie"`)
	require.Contains(t, logs, `"replayed":2,"skipped":1,"finished":true`)

	// Again: everything of the range now waits, so nothing is duplicated.
	res = post(t, c, replay, step2)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=replayed&m=3&n=0", res.Header.Get("Location"))
	require.Equal(t, before+2, e.count(t, `SELECT count(*) FROM outbox_messages`))

	// Every type (none chosen is refused; all chosen is the subscription).
	form.Set("type", "order.cancelled")
	form.Add("type", "order.placed")
	res, page = postPage(t, c, replay, form)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, "Re-send 4 events")
	require.Contains(t, page, "(every type it subscribes to)")

	// A range with nothing in it says so, and offers no confirmation.
	empty := url.Values{"csrf": {csrf}, "from": {minute(now.Add(-100 * time.Minute))}, "to": {minute(now.Add(-90 * time.Minute))},
		"type": {"order.placed"}}
	res, page = postPage(t, c, replay, empty)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, "nothing to replay")
	require.NotContains(t, page, `name="confirm"`)
}

func TestReplayRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	for i := range 2 {
		for _, id := range e.enqueue(t, "order.placed", map[string]int{"n": i}) {
			e.deliver(t, id, time.Minute)
		}
	}
	before := e.count(t, `SELECT count(*) FROM outbox_messages`)
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	replay := e.srv.URL + "/ops/endpoints/" + a.ID.String() + "/replay"
	now := time.Now()
	from, to := minute(now.Add(-time.Hour)), minute(now.Add(time.Minute))

	for name, tc := range map[string]struct {
		form url.Values
		says string
	}{
		"unparseable from": {url.Values{"from": {"yesterday"}, "to": {to}, "type": {"order.placed"}}, `From is not a date and time: &#34;yesterday&#34;`},
		"unparseable to":   {url.Values{"from": {from}, "to": {"2025-13-45T99:99"}, "type": {"order.placed"}}, "To is not a date and time"},
		"missing from":     {url.Values{"to": {to}, "type": {"order.placed"}}, "From is missing"},
		"from equals to":   {url.Values{"from": {to}, "to": {to}, "type": {"order.placed"}}, "must be before to"},
		"from after to":    {url.Values{"from": {to}, "to": {from}, "type": {"order.placed"}}, "must be before to"},
		"no type":          {url.Values{"from": {from}, "to": {to}}, "Choose at least one event type"},
		"unsubscribed":     {url.Values{"from": {from}, "to": {to}, "type": {"order.placed", "user.deleted"}}, `does not subscribe to &#34;user.deleted&#34;`},
		"bad cursor":       {url.Values{"from": {from}, "to": {to}, "type": {"order.placed"}, "after": {"nope"}}, "cursor"},
	} {
		for _, confirm := range []string{"", "yes"} {
			f := url.Values{"csrf": {csrf}, "confirm": {confirm}, "return": {"/ops"}}
			for k, v := range tc.form {
				f[k] = v
			}
			res, page := postPage(t, c, replay, f)
			require.Equal(t, http.StatusBadRequest, res.StatusCode, "%s (confirm=%q)", name, confirm)
			require.Contains(t, page, `id="replay-error"`, name)
			require.Contains(t, page, tc.says, name)
			require.Contains(t, page, `action="/ops/endpoints/`+a.ID.String()+`/replay"`, "the form again, to fix it")
			require.Equal(t, before, e.count(t, `SELECT count(*) FROM outbox_messages`), name)
		}
	}
	// What was entered is kept.
	_, page := postPage(t, c, replay, url.Values{"csrf": {csrf}, "from": {"yesterday"}, "to": {to}})
	require.Contains(t, page, `name="from" value="yesterday"`)
	require.Contains(t, page, `name="type" value="order.placed">`, "unchecked as it was sent")

	// No CSRF token, another endpoint, a GET: nothing replayed.
	res := post(t, c, replay, url.Values{"confirm": {"yes"}, "from": {from}, "to": {to}, "type": {"order.placed"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	res = post(t, c, e.srv.URL+"/ops/endpoints/"+uuid.NewString()+"/replay",
		url.Values{"csrf": {csrf}, "confirm": {"yes"}, "from": {from}, "to": {to}, "type": {"order.placed"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	res, _ = get(t, c, replay+"?confirm=yes&from="+url.QueryEscape(from)+"&to="+url.QueryEscape(to)+"&type=order.placed&csrf="+url.QueryEscape(csrf))
	require.Equal(t, http.StatusOK, res.StatusCode, "a GET shows the form")
	require.Equal(t, before, e.count(t, `SELECT count(*) FROM outbox_messages`))
	require.NotContains(t, e.logs.String(), `"action":"replay_endpoint"`)
}

func TestReplayNotDoneInOneRequestContinuesFromTheCursor(t *testing.T) {
	t.Parallel()
	// A budget that ends every request after its first batch.
	e := newEnv(t, token, func(o *ops.Options) { o.ReplayBudget = time.Nanosecond })
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	n := admin.MaxReplayBatch + 5
	e.seedEvents(t, n)
	// One of them already waits for a.
	e.exec(t, `INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(id), id, type, $1, created_at, created_at FROM outbox_events ORDER BY id DESC LIMIT 1`, a.ID)

	c, replay, page := e.askReplay(t, a.ID)
	require.Contains(t, page, "<dd>1,005</dd>")

	res, page := postPage(t, c, replay, hiddenFields(page))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, "Replay not finished")
	require.Contains(t, page, "so far it replayed 1,000 events (0 already waiting were skipped)")
	require.Contains(t, page, "Continue replay")
	require.Contains(t, page, "Stop here")
	require.Equal(t, int64(admin.MaxReplayBatch+1), e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, a.ID))
	next := hiddenFields(page)
	require.NotEmpty(t, next.Get("after"))
	require.Equal(t, "1000", next.Get("replayed"))

	res = post(t, c, replay, next)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=replayed&m=1&n=1004", res.Header.Get("Location"), "the totals of both requests")
	require.Equal(t, int64(n), e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, a.ID))
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT event_id FROM outbox_messages GROUP BY event_id HAVING count(*) > 1) d`),
		"no event was given two messages")
}

// The confirmation counts as much of the range as a replay's batch scans
// (ten batches' worth of events), not the whole range, which could be
// millions: a wider range says how many it counted so far, and until when.
func TestReplayOfAWideRangeConfirmsWhatItCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	e.seedEvents(t, 10*admin.MaxReplayBatch+5)
	_, _, page := e.askReplay(t, a.ID)
	require.Contains(t, page, "Re-send the chosen types&#39; events (at least 10,000) to this endpoint?")
	require.Contains(t, page, "<dt>Events in the range</dt><dd>at least 10,000: counted up to the events written at")
	require.Contains(t, page, "the range goes on, and the replay reads it to its end")
	require.Contains(t, page, ">Replay the range<")
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_messages`), "a confirmation writes nothing")
}

// A replay that fails after some batches keeps what they replayed and
// offers to continue from the last one, instead of an error page that loses
// the cursor; continuing, once the failure is gone, finishes the range
// without sending anything twice. The failure here: the database refuses
// the second batch's rows.
func TestReplayStoppedByAnErrorContinuesFromTheLastBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	n := admin.MaxReplayBatch + 5
	e.seedEvents(t, n)
	e.exec(t, `CREATE FUNCTION refuse_second_batch() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT count(*) FROM outbox_messages) > 1000 THEN
				RAISE EXCEPTION 'refusing the second batch';
			END IF;
			RETURN NULL;
		END $$`)
	e.exec(t, `CREATE TRIGGER refuse_second_batch AFTER INSERT ON outbox_messages
		FOR EACH STATEMENT EXECUTE FUNCTION refuse_second_batch()`)

	c, replay, page := e.askReplay(t, a.ID)
	res, page := postPage(t, c, replay, hiddenFields(page))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, "Replay not finished")
	require.Contains(t, page, "stopped on an error")
	require.NotContains(t, page, "refusing the second batch", "the database's error stays in the log")
	require.Contains(t, page, "so far it replayed 1,000 events")
	require.Equal(t, int64(admin.MaxReplayBatch), e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, a.ID),
		"the first batch is kept")
	next := hiddenFields(page)
	require.Equal(t, "1000", next.Get("replayed"))

	e.exec(t, `DROP TRIGGER refuse_second_batch ON outbox_messages`)
	res = post(t, c, replay, next)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=replayed&m=0&n=1005", res.Header.Get("Location"), "the totals of both requests")
	require.Equal(t, int64(n), e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, a.ID))
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT event_id FROM outbox_messages GROUP BY event_id HAVING count(*) > 1) d`),
		"no event was given two messages")
}

// seedEvents records n order.placed events of ten minutes ago, a
// microsecond apart.
func (e *env) seedEvents(t *testing.T, n int) {
	t.Helper()
	e.exec(t, `INSERT INTO outbox_events (id, type, payload, created_at)
		SELECT outbox_uuid_v7_at(x.at), 'order.placed', json_build_object('n', x.g), x.at
		FROM (SELECT g, clock_timestamp() - interval '10 minutes' AS at FROM generate_series(1, $1::integer) g) x`, n)
}

// askReplay signs in and submits endpoint's replay form for the last hour's
// order.placed events; it returns the client, the form's address and the
// confirmation page.
func (e *env) askReplay(t *testing.T, endpoint uuid.UUID) (*http.Client, string, string) {
	t.Helper()
	c := e.loggedIn(t)
	replay := e.srv.URL + "/ops/endpoints/" + endpoint.String() + "/replay"
	now := time.Now()
	res, page := postPage(t, c, replay, url.Values{"csrf": {e.csrf(t, c)}, "from": {minute(now.Add(-time.Hour))},
		"to": {minute(now.Add(time.Minute))}, "type": {"order.placed"}, "return": {"/ops"}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	return c, replay, page
}
