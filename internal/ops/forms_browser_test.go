package ops_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestBrowserFormMistakesAreShownWithTheForm submits the ops page's forms
// with mistakes in headless Chromium, scripts off: a new endpoint with a URL
// that is not one, a replay with no event type, with its range backwards,
// and over a range with no event, and a message list filtered by an event
// id that is not an id. Each answers with the form again, the values as
// entered and the mistake said beside them, and writes nothing.
func TestBrowserFormMistakesAreShownWithTheForm(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	e := newEnv(t, token)
	base := e.srv.URL
	b := browserPage{t, bctx}
	do, text, attr := b.do, b.text, b.attr
	submit := func(sel string) int {
		t.Helper()
		res, err := chromedp.RunResponse(bctx, chromedp.Click(chromedp.CSS(sel)))
		require.NoError(t, err)
		return int(res.Status)
	}
	rows := func() int64 {
		return e.count(t, `SELECT (SELECT count(*) FROM webhook_endpoints) + (SELECT count(*) FROM outbox_messages)`)
	}
	signIn(t, b, base)

	// A new endpoint whose URL is not one.
	do(chromedp.Navigate(base+"/ops/endpoints/new"), chromedp.WaitReady(chromedp.ID("save")),
		chromedp.SetValue(chromedp.ID("url"), "not a url"), chromedp.SetValue(chromedp.ID("event_types"), "order.placed"))
	require.Equal(t, http.StatusUnprocessableEntity, submit("#save"))
	do(chromedp.WaitReady(chromedp.ID("form-error")))
	require.Equal(t, `url: scheme "" is not http or https`, strings.TrimSpace(text("#form-error")),
		"the reason, without the chain of errors that carried it")
	require.Equal(t, "not a url", attr("#url", "value"), "the form keeps what was entered")
	require.Equal(t, "order.placed", attr("#event_types", "value"))
	require.Zero(t, e.count(t, `SELECT count(*) FROM webhook_endpoints`), "a refused form creates nothing")
	shot("80-new-endpoint-mistake.png")

	// An endpoint's replay page, with a few events of the last hour.
	ep := e.endpoint(t, "http://127.0.0.1:9/forms/a", "order.placed", "order.cancelled")
	for range 3 {
		e.enqueue(t, "order.placed", map[string]int{"n": 1})
	}
	before := rows()
	replay := base + "/ops/endpoints/" + ep.ID.String() + "/replay"
	submitReplay := "#replay-submit-" + ep.ID.String()
	typeBox := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Click(chromedp.CSS(`input[name="type"][value="` + name + `"]`))
	}
	// No type chosen.
	do(chromedp.Navigate(replay), chromedp.WaitReady(chromedp.CSS(submitReplay)), typeBox("order.placed"), typeBox("order.cancelled"))
	require.Equal(t, http.StatusBadRequest, submit(submitReplay))
	do(chromedp.WaitReady(chromedp.ID("replay-error")))
	require.Equal(t, "Choose at least one event type to replay.", text("#replay-error"))
	shot("81-replay-no-type.png")
	// From after to: the form as entered, with the mistake.
	from, to := time.Now().UTC().Add(-10*time.Minute), time.Now().UTC().Add(-70*time.Minute)
	do(chromedp.Navigate(replay), chromedp.WaitReady(chromedp.CSS(submitReplay)),
		chromedp.SetValue(chromedp.ID("replay-from-"+ep.ID.String()), minute(from)),
		chromedp.SetValue(chromedp.ID("replay-to-"+ep.ID.String()), minute(to)))
	require.Equal(t, http.StatusBadRequest, submit(submitReplay))
	do(chromedp.WaitReady(chromedp.ID("replay-error")))
	require.Contains(t, text("#replay-error"), "must be before")
	require.Equal(t, minute(from), attr("#replay-from-"+ep.ID.String(), "value"), "the form keeps what was entered")
	require.Equal(t, minute(to), attr("#replay-to-"+ep.ID.String(), "value"))
	shot("82-replay-backwards.png")
	// A range in which the database holds no event: nothing to confirm.
	from, to = time.Now().UTC().Add(-50*time.Hour), time.Now().UTC().Add(-49*time.Hour)
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_events WHERE created_at >= $1 AND created_at < $2`,
		from.Truncate(time.Minute), to.Truncate(time.Minute)), "no event was written in the range")
	do(chromedp.Navigate(replay), chromedp.WaitReady(chromedp.CSS(submitReplay)),
		chromedp.SetValue(chromedp.ID("replay-from-"+ep.ID.String()), minute(from)),
		chromedp.SetValue(chromedp.ID("replay-to-"+ep.ID.String()), minute(to)))
	require.Equal(t, http.StatusOK, submit(submitReplay))
	do(chromedp.WaitReady(chromedp.ID("replay-error")))
	require.Contains(t, text("#replay-error"), "there is nothing to replay")
	require.False(t, b.exists("#confirm"), "nothing to confirm")
	shot("83-replay-nothing-in-range.png")
	require.Equal(t, before, rows(), "no mistaken replay wrote anything")
	require.NotContains(t, e.logs.String(), `"action":"replay_endpoint"`)

	// The message list, filtered by an event id that is not one.
	do(chromedp.Navigate(base+"/ops/messages"), chromedp.WaitReady(chromedp.ID("filters")),
		chromedp.SetValue(chromedp.ID("f-event"), "order-42"))
	require.Equal(t, http.StatusBadRequest, submit("#apply"))
	do(chromedp.WaitReady(chromedp.ID("filter-error")))
	require.Equal(t, "Event id must be an id (a UUID)", text("#filter-error"))
	require.Equal(t, "order-42", attr("#f-event", "value"))
	require.False(t, b.exists("#messages"), "no list for a filter that cannot be read")
	shot("84-messages-filter-mistake.png")
}
