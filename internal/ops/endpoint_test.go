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
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/webhook"
)

// One endpoint's story: its state, what waits and failed, its success rate
// and latency over the hour and the day, and its recent attempts with their
// errors, all as the database has them.
func TestEndpointPageTellsTheEndpointsStory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	ep := e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	other := e.endpoint(t, "http://127.0.0.1:9/other", "order.cancelled")
	e.enqueue(t, "order.cancelled", 0)
	// Within the hour: 3 delivered (8 ms each) and one failed after three
	// attempts (12 ms each); 2 hours ago: 2 delivered. The other endpoint's
	// attempts are not this one's.
	for range 3 {
		e.deliver(t, e.enqueue(t, "order.placed", 1)[0], time.Minute)
	}
	failed := e.enqueue(t, "order.placed", 2)[0]
	e.fail(t, failed)
	for range 2 {
		e.deliver(t, e.enqueue(t, "order.placed", 3)[0], 2*time.Hour)
	}
	waiting := e.enqueue(t, "order.placed", 4)
	e.exec(t, `UPDATE outbox_messages SET status = 'delivered', attempts = 1, delivered_at = now() WHERE destination = $1`, other.ID)
	e.exec(t, `INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
		SELECT id, 2, 'retry', now() - interval '1 minute', now() - interval '1 minute' + interval '900 ms', 503, 'other endpoint down'
		FROM outbox_messages WHERE destination = $1`, other.ID)
	deriveFromHistory(t, e.pool)
	// The same numbers from the database: this endpoint's attempts.
	hourAttempts := e.count(t, `SELECT count(*) FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
		WHERE m.destination = $1 AND a.finished_at >= now() - interval '1 hour'`, ep.ID)
	require.Equal(t, int64(6), hourAttempts, "3 delivered and 3 attempts of the failed one")

	res, body := get(t, c, e.srv.URL+"/ops/endpoints/"+ep.ID.String())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="endpoint-state" data-state="healthy"`)
	require.Equal(t, int64(1), dataValue(t, body, "endpoint-waiting"), "the one message still pending: %v", waiting)
	require.Equal(t, int64(1), dataValue(t, body, "endpoint-failed"))
	require.Contains(t, body, `id="success-hour" data-attempts="6" data-delivered="3">50%<`)
	require.Contains(t, body, `<span id="success-day">62.5%</span> of 8`, "5 of 8 over the day")
	require.Regexp(t, `data-window="hour"><th scope="row">Last hour</th><td class="n">3</td><td class="n">8.0 ms</td>`, body)
	require.Regexp(t, `data-window="day"><th scope="row">Last day</th><td class="n">5</td><td class="n">8.0 ms</td>`, body)
	require.Equal(t, 8, strings.Count(body, `<tr data-outcome=`), "the 8 attempts of the day, the other endpoint's left out")
	require.Contains(t, body, "500 Internal Server Error: receiver down")
	require.NotContains(t, body, "other endpoint down")
	require.Contains(t, body, `href="/ops/messages/`+failed.String()+`"`)
	require.Contains(t, body, "not delivering", "no relay runs in this test, so the page says so")

	// Backing off: "circuit open" with its next probe.
	e.exec(t, `UPDATE webhook_endpoints SET health = 'backing_off', health_reason = 'connection refused',
		consecutive_failures = 5, health_changed_at = now(), backoff_until = now() + interval '40 seconds' WHERE id = $1`, ep.ID)
	_, body = get(t, c, e.srv.URL+"/ops/endpoints/"+ep.ID.String())
	require.Contains(t, body, `data-state="backing_off"`)
	require.Contains(t, body, "circuit open")
	require.Contains(t, body, "after 5 failures in a row")
	require.Regexp(t, `id="next-probe" title="[^"]+">in (3\d|40)s<`, body)
	require.Contains(t, body, `id="probe"`)

	// Probe now: asked first, then its next probe is now, not in 40 s.
	probeDue := func() bool {
		return e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND backoff_until <= now()`, ep.ID) == 1
	}
	probe := e.srv.URL + "/ops/endpoints/" + ep.ID.String() + "/enable"
	res, body = postPage(t, c, probe, url.Values{"csrf": {e.csrf(t, c)}, "return": {"/ops/endpoints/" + ep.ID.String()}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Send one message to it now instead of at its next probe?")
	require.False(t, probeDue(), "nothing changes before the confirmation")
	res = post(t, c, probe, hiddenFields(body))
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops/endpoints/"+ep.ID.String()+"?done=probing", res.Header.Get("Location"))
	require.True(t, probeDue())
	require.Contains(t, e.logs.String(), `"action":"probe_endpoint"`)
	_, body = get(t, c, e.srv.URL+res.Header.Get("Location"))
	require.Contains(t, body, "Probing now: the relay sends one message")

	res, _ = get(t, c, e.srv.URL+"/ops/endpoints/"+uuid.NewString())
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

var secretRe = regexp.MustCompile(`<code class="secret" id="secret">(whsec_[^<]+)</code>`)

// secretOn reads the secret a page shows (html/template writes + as &#43;).
func secretOn(body string) []string {
	m := secretRe.FindStringSubmatch(body)
	if m != nil {
		m[1] = html.UnescapeString(m[1])
	}
	return m
}

// From the page an operator creates an endpoint (its secret shown once),
// edits it in place, rotates its secret, discards what waits for it and
// deletes it; each change is confirmed first (but creation, whose form is
// the confirmation), carries the CSRF token, and is logged.
func TestEndpointActionsFromThePage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	ctx := context.Background()

	// Bad input: a clear error and nothing written.
	res, body := postPage(t, c, e.srv.URL+"/ops/endpoints/new", url.Values{"csrf": {csrf}, "url": {"ftp://x"}, "event_types": {"order.placed"}})
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Contains(t, body, `id="form-error"`)
	require.Contains(t, body, `url: scheme &#34;ftp&#34; is not http or https`, "the reason, in the person's terms")
	require.NotContains(t, body, "netguard", "not the chain of packages it came through")
	res, _ = postPage(t, c, e.srv.URL+"/ops/endpoints/new", url.Values{"csrf": {csrf}, "url": {"http://127.0.0.1:9/x"}, "event_types": {" , "}})
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Zero(t, e.count(t, `SELECT count(*) FROM webhook_endpoints`))

	res, body = postPage(t, c, e.srv.URL+"/ops/endpoints/new", url.Values{"csrf": {csrf},
		"url": {"http://127.0.0.1:9/hook"}, "event_types": {"order.placed, order.cancelled"}})
	require.Equal(t, http.StatusCreated, res.StatusCode)
	m := secretOn(body)
	require.NotNil(t, m, "the new secret is on the page: %s", body)
	eps, err := e.admin.Endpoints(ctx)
	require.NoError(t, err)
	require.Len(t, eps, 1)
	ep := eps[0]
	require.Equal(t, []string{"order.cancelled", "order.placed"}, ep.EventTypes)
	require.Equal(t, "http://127.0.0.1:9/hook", ep.URL)
	_, err = webhook.NewVerifier(m[1])
	require.NoError(t, err, "a usable secret")
	_, body = get(t, c, e.srv.URL+"/ops/endpoints/"+ep.ID.String())
	require.NotContains(t, body, m[1], "the secret is shown once")
	base := e.srv.URL + "/ops/endpoints/" + ep.ID.String()

	// Edit: a change that cannot be made is refused before the
	// confirmation is asked for; a good one is confirmed, then made in
	// place (same id).
	res, body = postPage(t, c, base+"/edit", url.Values{"csrf": {csrf}, "url": {"ftp://x"}, "event_types": {"order.placed"}})
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Contains(t, body, `id="form-error"`)
	require.NotContains(t, body, "Change endpoint?")
	form := url.Values{"csrf": {csrf}, "url": {"http://127.0.0.1:9/new-hook"}, "event_types": {"order.placed"}}
	res, body = postPage(t, c, base+"/edit", form)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Change endpoint?")
	require.Contains(t, body, "http://127.0.0.1:9/new-hook")
	got, _ := e.admin.Endpoint(ctx, ep.ID)
	require.Equal(t, "http://127.0.0.1:9/hook", got.URL, "not before the confirmation")
	hidden := hiddenFields(body)
	res = post(t, c, base+"/edit", hidden)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops/endpoints/"+ep.ID.String()+"?done=updated", res.Header.Get("Location"))
	got, _ = e.admin.Endpoint(ctx, ep.ID)
	require.Equal(t, "http://127.0.0.1:9/new-hook", got.URL)
	require.Equal(t, []string{"order.placed"}, got.EventTypes)

	// Rotate: confirmed, then a new secret, shown once, the old one kept
	// for the overlap, whose end the page states as stored.
	var before string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT secret FROM webhook_endpoints WHERE id = $1`, ep.ID).Scan(&before))
	res, body = postPage(t, c, base+"/rotate-secret", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Rotate signing secret?")
	require.Contains(t, body, "For the next 24 hours (until about ", "the confirmation states the overlap")
	confirm := hiddenFields(body)
	require.Contains(t, confirm, "seen_rotation")
	res, body = postPage(t, c, base+"/rotate-secret", confirm)
	require.Equal(t, http.StatusOK, res.StatusCode)
	rotated := secretOn(body)
	require.NotNil(t, rotated, body)
	require.NotEqual(t, m[1], rotated[1])
	var overlapEnd time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT previous_secret_expires_at FROM webhook_endpoints
		WHERE id = $1 AND previous_secret IS NOT NULL AND previous_secret_expires_at > now() + interval '23 hours'`, ep.ID).Scan(&overlapEnd))
	require.Contains(t, body, "Until <time id=\"overlap-end\" datetime=\""+overlapEnd.UTC().Format(time.RFC3339Nano)+"\">",
		"the secret page states the overlap's real end")

	// The confirmation submitted twice (a double click, a reload of the
	// page showing the secret) rotates once: the secret the first showed
	// stays current, and the one before it keeps signing for the overlap.
	res, body = postPage(t, c, base+"/rotate-secret", confirm)
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.Contains(t, body, "Already rotated")
	var current, previous string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT secret, previous_secret FROM webhook_endpoints WHERE id = $1`, ep.ID).Scan(&current, &previous))
	require.Equal(t, before, previous, "the secret the receiver used still signs")
	require.NotEqual(t, before, current)
	// Another rotation while the overlap runs is refused before its
	// confirmation, saying until when: it would drop the previous secret.
	res, body = postPage(t, c, base+"/rotate-secret", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusConflict, res.StatusCode)
	require.Contains(t, body, "Rotation in progress")
	require.Contains(t, body, "still signs until "+overlapEnd.UTC().Format("2006-01-02 15:04:05 UTC"))

	// Discard what waits: pending and parked go, the failed one and the
	// one in flight stay.
	ids := e.enqueueKeyed(t, "order.placed", "k", 1)
	ids = append(ids, e.enqueueKeyed(t, "order.placed", "k", 2)...)
	ids = append(ids, e.enqueue(t, "order.placed", 3)...)
	ids = append(ids, e.enqueue(t, "order.placed", 4)...)
	ids = append(ids, e.enqueue(t, "order.placed", 5)...)
	e.park(t, ids[1])
	e.fail(t, ids[3])
	e.exec(t, `UPDATE outbox_messages SET status = 'claimed', claimed_at = now(), claim_token = gen_random_uuid() WHERE id = $1`, ids[4])
	res, body = postPage(t, c, base+"/discard-waiting", url.Values{"csrf": {csrf}, "return": {"/ops/endpoints/" + ep.ID.String()}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Discard the 3 messages waiting", "pending and parked are discarded; the claimed one and the failed one are not")
	require.Contains(t, body, "Being sent now (not discarded)</dt><dd>1</dd>", "the claimed one is named apart")
	res = post(t, c, base+"/discard-waiting", hiddenFields(body))
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops/endpoints/"+ep.ID.String()+"?done=discarded&n=3", res.Header.Get("Location"))
	for i, want := range []string{outbox.StatusDiscarded, outbox.StatusDiscarded, outbox.StatusDiscarded, outbox.StatusFailed, outbox.StatusClaimed} {
		require.Equal(t, want, e.status(t, ids[i]), "message %d", i)
	}
	require.Equal(t, int64(3), e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1
		AND status = 'discarded' AND last_error = 'discarded by an operator' AND NOT parked`, ep.ID))

	// Delete: confirmed, then gone, its undelivered messages discarded.
	res, body = postPage(t, c, base+"/delete", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Delete this endpoint for good?")
	res = post(t, c, base+"/delete", hiddenFields(body))
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=deleted&n=2", res.Header.Get("Location"), "the failed and the claimed one")
	_, err = e.admin.Endpoint(ctx, ep.ID)
	require.ErrorIs(t, err, admin.ErrNotFound)

	logs := e.logs.String()
	for _, action := range []string{"create_endpoint", "update_endpoint", "rotate_secret", "discard_waiting", "delete_endpoint"} {
		require.Contains(t, logs, `"action":"`+action+`"`)
	}
	require.NotContains(t, logs, m[1], "secrets are never logged")
	require.NotContains(t, logs, rotated[1])

	// None of them acts without the session's CSRF token.
	victim := e.endpoint(t, "http://127.0.0.1:9/victim", "order.placed")
	vbase := e.srv.URL + "/ops/endpoints/" + victim.ID.String()
	for _, path := range []string{"/edit", "/rotate-secret", "/discard-waiting", "/delete"} {
		res := post(t, c, vbase+path, url.Values{"confirm": {"yes"}, "url": {"http://127.0.0.1:9/evil"}, "event_types": {"x"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, path)
	}
	res = post(t, c, e.srv.URL+"/ops/endpoints/new", url.Values{"url": {"http://127.0.0.1:9/evil"}, "event_types": {"x"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	got, err = e.admin.Endpoint(ctx, victim.ID)
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:9/victim", got.URL)
	require.Equal(t, int64(1), e.count(t, `SELECT count(*) FROM webhook_endpoints`))
}

// The new-endpoint form submitted twice (a double click: the browser shows
// the second answer) creates one endpoint, and both answers show its
// secret; the same form with another URL is a conflict. Each submission
// made an endpoint of its own, the first with a secret nobody saw.
func TestNewEndpointFormSubmittedTwiceCreatesOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	_, page := get(t, c, e.srv.URL+"/ops/endpoints/new")
	m := regexp.MustCompile(`name="endpoint_id" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, m, "the form carries the id it will create: %s", page)
	sig := regexp.MustCompile(`name="endpoint_id_sig" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, sig, "and its signature: %s", page)
	form := url.Values{"csrf": {csrf}, "endpoint_id": {m[1]}, "endpoint_id_sig": {sig[1]},
		"url": {"http://127.0.0.1:9/hook"}, "event_types": {"order.placed"}}
	var secrets []string
	for range 2 {
		res, body := postPage(t, c, e.srv.URL+"/ops/endpoints/new", form)
		require.Equal(t, http.StatusCreated, res.StatusCode, "%s", body)
		s := secretOn(body)
		require.NotNil(t, s, "the secret is on the page: %s", body)
		secrets = append(secrets, s[1])
	}
	require.Equal(t, secrets[0], secrets[1], "the endpoint's one secret, shown by both answers")
	require.Equal(t, int64(1), e.count(t, `SELECT count(*) FROM webhook_endpoints`))
	ep, err := e.admin.Endpoint(context.Background(), uuid.MustParse(m[1]))
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:9/hook", ep.URL)

	form.Set("url", "http://127.0.0.1:9/other")
	res, body := postPage(t, c, e.srv.URL+"/ops/endpoints/new", form)
	require.Equal(t, http.StatusConflict, res.StatusCode, "one id, another endpoint")
	require.Contains(t, body, "This form created its endpoint already", "said as the form's, not a message's conflict")
	require.Equal(t, int64(1), e.count(t, `SELECT count(*) FROM webhook_endpoints`))
}

// A discard of more than a request can settle stops after the batches of
// its budget and asks to continue, saying how many it has settled; the
// continuations finish and the notice counts them all. The budget is
// shortened to end after the first batch (the test is about it).
func TestDiscardLongerThanARequestContinues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, func(o *ops.Options) { o.ReplayBudget = time.Nanosecond })
	ep := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	const n = 10_000 + 5 // a batch and then some
	e.exec(t, `WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(x.at), 'order.placed', '{}', x.at
			FROM (SELECT clock_timestamp() AS at FROM generate_series(1, $1::integer)) x
			RETURNING id, type, created_at)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(id), id, type, $2, created_at, created_at FROM ev`, n, ep.ID)
	c := e.loggedIn(t)
	base := e.srv.URL + "/ops/endpoints/" + ep.ID.String()
	_, body := postPage(t, c, base+"/discard-waiting", url.Values{"csrf": {e.csrf(t, c)}, "return": {"/ops"}})
	res, body := postPage(t, c, base+"/discard-waiting", hiddenFields(body))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Discard not finished")
	require.Contains(t, body, "settled 10000 messages so far")
	require.Equal(t, int64(5), e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending'`, ep.ID))
	// The rest is one short batch; only a batch that finds nothing ends it
	// (a message claimed meanwhile was left to its claim).
	res, body = postPage(t, c, base+"/discard-waiting", hiddenFields(body))
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "settled 10005 messages so far")
	res = post(t, c, base+"/discard-waiting", hiddenFields(body))
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=discarded&n=10005", res.Header.Get("Location"), "the total of every request")
	require.Zero(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending'`, ep.ID))
}

// The new-endpoint form shows a secret again only to a second submission
// of the form it issued: posted with the id of an existing endpoint (read
// off its page) and its URL and types, it showed that endpoint's live
// signing secret to any session, at any time. Now such a post creates an
// endpoint of its own, and a form issued to another session is no better.
func TestNewEndpointFormNeverShowsAnExistingEndpointsSecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	existing, err := e.admin.CreateEndpoint(context.Background(), "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.NoError(t, err)
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)

	// A form issued to another session, rewritten with the existing id.
	other := e.loggedIn(t)
	_, page := get(t, other, e.srv.URL+"/ops/endpoints/new")
	sig := regexp.MustCompile(`name="endpoint_id_sig" value="([^"]+)"`).FindStringSubmatch(page)
	require.NotNil(t, sig, "%s", page)
	for name, form := range map[string]url.Values{
		"no signature":          {"csrf": {csrf}, "endpoint_id": {existing.ID.String()}},
		"another form's":        {"csrf": {csrf}, "endpoint_id": {existing.ID.String()}, "endpoint_id_sig": {sig[1]}},
		"another session's own": {"csrf": {csrf}, "endpoint_id": {regexp.MustCompile(`name="endpoint_id" value="([^"]+)"`).FindStringSubmatch(page)[1]}, "endpoint_id_sig": {sig[1]}},
	} {
		form.Set("url", existing.URL)
		form.Set("event_types", "order.placed")
		res, body := postPage(t, c, e.srv.URL+"/ops/endpoints/new", form)
		require.Equal(t, http.StatusCreated, res.StatusCode, "%s: an endpoint of its own: %s", name, body)
		shown := secretOn(body)
		require.NotNil(t, shown, "%s: the new endpoint's secret: %s", name, body)
		require.NotEqual(t, existing.Secret, shown[1], "%s: the existing endpoint's secret is never shown", name)
		require.NotContains(t, body, existing.ID.String(), name)
	}
	require.Equal(t, int64(4), e.count(t, `SELECT count(*) FROM webhook_endpoints`), "three new endpoints beside the existing one")
}
