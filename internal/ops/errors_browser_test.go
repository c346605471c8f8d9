package ops_test

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

// TestBrowserErrorPagesSayWhatHappened meets the ops page's refusals in
// headless Chromium, scripts off, each with the status a script would read
// and a page that says what happened: sign-ins throttled after too many
// wrong tokens (the right one still gets in), a page or a message that does
// not exist, a retry confirmed after someone else retried the message (a
// conflict), a form of a session that has since ended (stale), and a pause
// confirmed after the endpoint was deleted. None of them changes the
// database.
func TestBrowserErrorPagesSayWhatHappened(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	e := newEnv(t, token)
	base := e.srv.URL
	b := browserPage{t, bctx}
	do, text := b.do, b.text
	// answer runs a step that navigates and returns the new page's status
	// and headers, once it has loaded.
	answer := func(tab context.Context, step chromedp.Action[chromedp.Void]) (int, map[string]any) {
		t.Helper()
		res, err := chromedp.RunResponse(tab, step)
		require.NoError(t, err)
		require.NotNil(t, res)
		return int(res.Status), res.Headers
	}
	// errorPage checks the error page shown: its status, title and text.
	errorPage := func(status int, title, says string) {
		t.Helper()
		do(chromedp.WaitReady(chromedp.CSS(".error-card")))
		require.Equal(t, strconv.Itoa(status), text(".error-code"))
		require.Equal(t, title, text(".error-card h1"))
		require.Contains(t, text(".error-card"), says)
	}

	// Wrong tokens: each is said to be wrong, until the throttle answers
	// 429 and says how long to wait, as Retry-After does.
	do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("token")))
	wrong := 0
	for {
		do(chromedp.SetValue(chromedp.ID("token"), "not-the-token"))
		status, hdr := answer(bctx, chromedp.Click(chromedp.ID("login")))
		do(chromedp.WaitReady(chromedp.ID("token")))
		if status == http.StatusTooManyRequests {
			m := regexp.MustCompile(`Too many failed sign-ins from here\. Try again in (\d+) seconds\.`).FindStringSubmatch(text(".alert"))
			require.NotNil(t, m, "the throttled page says why and for how long")
			require.Equal(t, m[1], hdr["Retry-After"], "the page's wait is the Retry-After header's")
			break
		}
		require.Equal(t, http.StatusUnauthorized, status)
		require.Equal(t, "That is not the admin token.", text(".alert"))
		wrong++
		require.Less(t, wrong, 1000, "wrong tokens were never throttled")
	}
	require.Positive(t, wrong, "a few wrong tokens are only refused before the throttle starts")
	require.Contains(t, e.logs.String(), `"msg":"ops login failed"`)
	shot("70-login-throttled.png")
	do(chromedp.SetValue(chromedp.ID("token"), token))
	status, _ := answer(bctx, chromedp.Click(chromedp.ID("login")))
	require.Equal(t, http.StatusOK, status, "the right token gets in while wrong ones are throttled")
	do(chromedp.WaitReady(chromedp.ID("search")))

	// Pages that do not exist.
	status, _ = answer(bctx, chromedp.Navigate(base+"/ops/no-such-page"))
	require.Equal(t, http.StatusNotFound, status)
	errorPage(http.StatusNotFound, "Not found", "There is no ops page at /ops/no-such-page.")
	shot("71-not-found.png")
	gone := uuid.New()
	status, _ = answer(bctx, chromedp.Navigate(base+"/ops/messages/"+gone.String()))
	require.Equal(t, http.StatusNotFound, status)
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE id = $1`, gone))
	errorPage(http.StatusNotFound, "Not found", "It no longer exists")
	follow(t, bctx, chromedp.Click(chromedp.CSS(`.error-card a[href="/ops"]`)))
	do(chromedp.WaitReady(chromedp.ID("search")))

	// A retry confirmed after someone else retried the message: nothing to
	// do, and the page says why.
	ep := e.endpoint(t, "http://127.0.0.1:9/errors/a", "order.placed")
	msgs := append(e.enqueue(t, "order.placed", map[string]int{"n": 1}), e.enqueue(t, "order.placed", map[string]int{"n": 2})...)
	for _, m := range msgs {
		e.fail(t, m)
	}
	do(chromedp.Navigate(base+"/ops/messages/"+msgs[0].String()), chromedp.WaitReady(chromedp.ID("retry")))
	follow(t, bctx, chromedp.Click(chromedp.ID("retry")))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	_, err := e.admin.Retry(ctx, msgs[0])
	require.NoError(t, err)
	status, _ = answer(bctx, chromedp.Click(chromedp.ID("confirm")))
	require.Equal(t, http.StatusConflict, status)
	errorPage(http.StatusConflict, "Nothing to do", "this one is not failed (any more)")
	require.Equal(t, outbox.StatusPending, e.status(t, msgs[0]), "the other retry stands")
	shot("72-conflict-already-retried.png")

	// A form of a session that has ended: the confirmation was shown, then
	// the operator signed out and in again in another tab.
	do(chromedp.Navigate(base+"/ops/messages/"+msgs[1].String()), chromedp.WaitReady(chromedp.ID("skip")))
	follow(t, bctx, chromedp.Click(chromedp.ID("skip")))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	tab, closeTab := chromedp.NewContext(bctx)
	tb := browserPage{t, tab}
	tb.do(chromedp.Navigate(base+"/ops"), chromedp.WaitReady(chromedp.ID("logout")))
	follow(t, tab, chromedp.Click(chromedp.ID("logout")))
	tb.do(chromedp.WaitReady(chromedp.ID("token")), chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, tab, chromedp.Click(chromedp.ID("login")))
	tb.do(chromedp.WaitReady(chromedp.ID("search")))
	closeTab()
	status, _ = answer(bctx, chromedp.Click(chromedp.ID("confirm")))
	require.Equal(t, http.StatusForbidden, status)
	errorPage(http.StatusForbidden, "Request refused", "This form has expired or did not come from the ops page.")
	require.Equal(t, outbox.StatusFailed, e.status(t, msgs[1]), "a refused form changes nothing")
	require.NotContains(t, e.logs.String(), `"action":"skip_message"`)
	shot("73-stale-form.png")

	// A pause confirmed after the endpoint was deleted.
	do(chromedp.Navigate(base+"/ops/endpoints/"+ep.ID.String()), chromedp.WaitReady(chromedp.ID("pause")))
	follow(t, bctx, chromedp.Click(chromedp.ID("pause")))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	_, err = e.admin.DeleteEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	status, _ = answer(bctx, chromedp.Click(chromedp.ID("confirm")))
	require.Equal(t, http.StatusNotFound, status)
	errorPage(http.StatusNotFound, "Not found", "It no longer exists")
	require.Zero(t, e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE id = $1`, ep.ID))
	require.NotContains(t, e.logs.String(), `"action":"disable_endpoint"`)
	shot("74-endpoint-deleted-meanwhile.png")
}
