package ops_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

// keyedBacklog writes three events of one ordering key for one endpoint:
// the first failed, holding its key, and the two later ones parked behind
// it, as a relay would leave them. It returns the three messages' ids.
func keyedBacklog(t *testing.T, e *env, key string) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for i := range 3 {
		m := e.enqueueKeyed(t, "order.placed", key, map[string]int{"n": i})
		require.Len(t, m, 1)
		ids = append(ids, m[0])
	}
	e.fail(t, ids[0])
	e.park(t, ids[1:]...)
	return ids
}

func TestParkedMessageNamesTheMessageItWaitsFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ep := e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	ids := keyedBacklog(t, e, "order-42")
	c := e.loggedIn(t)

	m, err := e.admin.Message(context.Background(), ids[1])
	require.NoError(t, err)
	require.True(t, m.Parked)
	require.NotNil(t, m.HeldBy)

	res, body := get(t, c, e.srv.URL+"/ops/messages/"+ids[1].String())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `data-status="pending"`)
	require.Contains(t, body, `id="held-by" data-parked="true"`)
	require.Contains(t, body, `<a class="mono" href="/ops/messages/`+m.HeldBy.ID.String()+`" id="held-by-link">`)
	require.Equal(t, ids[0], m.HeldBy.ID, "the failed one holds the key")
	require.Contains(t, body, `id="held-by-status">failed<`)
	require.Contains(t, body, "waits for an earlier message of its ordering key")
	require.Contains(t, body, `id="ordering-key">order-42<`)
	require.Contains(t, body, `<span class="badge badge-parked">parked</span>`)
	require.Contains(t, body, "none while it is parked", "no next attempt time while parked")
	require.NotContains(t, body, `id="retry"`)
	require.NotContains(t, body, `id="skip"`)
	require.Contains(t, body, `id="event-id">`+e.eventOf(t, ids[1]).String()+`<`)

	// The head's page says what it holds, and offers Retry and Skip.
	_, body = get(t, c, e.srv.URL+"/ops/messages/"+ids[0].String())
	require.Contains(t, body, `id="holding" data-holding="2"`)
	require.Contains(t, body, "It holds its ordering key.")
	require.Contains(t, body, "2 later messages of key")
	require.Contains(t, body, "not sent until it is retried (and delivered) or skipped")
	require.Contains(t, body, `action="/ops/messages/`+ids[0].String()+`/skip"`)
	require.Contains(t, body, `id="skip"`)
	require.NotContains(t, body, `id="held-by"`)

	// The overview counts the parked ones, overall and for the endpoint,
	// and the failed list says the message holds its key.
	_, body = get(t, c, e.srv.URL+"/ops")
	require.Equal(t, int64(2), dataValue(t, body, "parked-count"))
	require.Equal(t, int64(2), dataValue(t, body, "pending-count"), "parked messages are pending too")
	row := body[strings.Index(body, `id="endpoint-`+ep.ID.String()+`"`):]
	row = row[:strings.Index(row, "</tr>")]
	require.Contains(t, row, `data-waiting="2" data-parked="2"`)
	require.Contains(t, row, "2 parked")
	failed := body[strings.Index(body, `id="failed-`+ids[0].String()+`"`):]
	failed = failed[:strings.Index(failed, "</tr>")]
	require.Contains(t, failed, `data-holds="order-42"`)
	require.Contains(t, failed, "holds its key")
	recent := body[strings.Index(body, `id="recent-`+ids[2].String()+`"`):]
	recent = recent[:strings.Index(recent, "</tr>")]
	require.Contains(t, recent, "parked")

	// Retrying says it still goes first.
	res, page := postPage(t, c, e.srv.URL+"/ops/messages/"+ids[0].String()+"/retry", url.Values{"csrf": {e.csrf(t, c)}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, "It still goes first: the 2 later messages of its key behind it wait until it is delivered.")
	require.Equal(t, outbox.StatusFailed, e.status(t, ids[0]))
}

func TestSkipAFailedKeyedMessageLetsTheNextOneGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	ids := keyedBacklog(t, e, "order-7")
	ctx := context.Background()
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	skip := e.srv.URL + "/ops/messages/" + ids[0].String() + "/skip"
	back := "/ops/messages/" + ids[0].String()

	// Without the CSRF token: refused, nothing changes.
	res := post(t, c, skip, url.Values{"confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Equal(t, outbox.StatusFailed, e.status(t, ids[0]))

	// First step: a confirmation page that says what skipping means.
	res, page := postPage(t, c, skip, url.Values{"csrf": {csrf}, "return": {back}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, `name="confirm" value="yes"`)
	require.Contains(t, page, "never sent")
	require.Contains(t, page, "cannot be undone")
	require.Contains(t, page, "2 later messages of its ordering key")
	require.Contains(t, page, "btn-danger")
	require.Contains(t, page, "order-7")
	require.Equal(t, outbox.StatusFailed, e.status(t, ids[0]))

	// Second step: discarded, never sent; the next of its key is due.
	res = post(t, c, skip, url.Values{"csrf": {csrf}, "confirm": {"yes"}, "return": {back}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, back+"?done=skipped", res.Header.Get("Location"))
	require.Equal(t, outbox.StatusDiscarded, e.status(t, ids[0]))
	require.Equal(t, int64(0), e.count(t, `SELECT count(*) FROM outbox_attempts WHERE message_id = $1 AND attempt > 3`, ids[0]))
	require.Eventually(t, func() bool {
		m, err := e.admin.Message(ctx, ids[1])
		return err == nil && !m.Parked && m.Status == outbox.StatusPending
	}, 5*time.Second, 20*time.Millisecond, "the next message of the key never became due")
	next, err := e.admin.Message(ctx, ids[1])
	require.NoError(t, err)
	require.NotNil(t, next.NextAttemptAt)
	last, err := e.admin.Message(ctx, ids[2])
	require.NoError(t, err)
	require.True(t, last.Parked, "the third waits for the second, which is now first")

	_, body := get(t, c, e.srv.URL+back+"?done=skipped")
	require.Contains(t, body, "Message skipped")
	require.Contains(t, body, `data-status="discarded"`)
	require.Contains(t, body, `id="discarded-at"`)
	require.Contains(t, body, "skipped by an operator")
	require.NotContains(t, body, `id="skip"`)
	require.NotContains(t, body, `id="holding"`)
	_, body = get(t, c, e.srv.URL+"/ops/messages/"+ids[1].String())
	require.NotContains(t, body, `id="held-by"`)
	require.Contains(t, body, "<dt>Next attempt</dt><dd>")

	logs := e.logs.String()
	require.Contains(t, logs, `"action":"skip_message","auth":"cookie"`)
	require.Contains(t, logs, `"message_id":"`+ids[0].String()+`"`)

	// It is not failed any more: nothing to skip.
	res = post(t, c, skip, url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusConflict, res.StatusCode)
	res = post(t, c, skip, url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusConflict, res.StatusCode)
	res = post(t, c, e.srv.URL+"/ops/messages/"+uuid.NewString()+"/skip", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}
