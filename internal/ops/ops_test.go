package ops_test

import (
	"context"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/proctest"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox"
)

const token = "s3cret-admin-token-for-tests"

type env struct {
	pool  *pgxpool.Pool
	admin *admin.Service
	srv   *httptest.Server
	logs  *proctest.Output
	now   time.Time
	clock func() time.Time
}

func newEnv(t *testing.T, tok string, opts ...func(*ops.Options)) *env {
	t.Helper()
	e := &env{pool: dbtest.Pool(t), logs: &proctest.Output{}}
	logger := slog.New(slog.NewJSONHandler(e.logs, nil))
	e.admin = admin.New(e.pool, netguard.Guard{AllowPrivate: true}, logger)
	var mu sync.Mutex
	var offset time.Duration
	e.clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(offset) }
	o := ops.Options{Admin: e.admin, Pool: e.pool, Token: tok, Logger: logger, Now: e.clock, SessionTTL: time.Hour}
	for _, opt := range opts {
		opt(&o)
	}
	h := ops.New(o)
	mux := http.NewServeMux()
	mux.Handle("/ops", h)
	mux.Handle("/ops/", h)
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

// browser is a client with a cookie jar that does not follow redirects, so
// tests see each answer.
func (e *env) browser(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (e *env) loggedIn(t *testing.T) *http.Client {
	t.Helper()
	c := e.browser(t)
	res := post(t, c, e.srv.URL+"/ops/login", url.Values{"token": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	return c
}

func get(t *testing.T, c *http.Client, u string, hdr ...string) (*http.Response, string) {
	t.Helper()
	return call(t, c, http.MethodGet, u, "", hdr...)
}

// call sends one request and returns the answer with its body.
func call(t *testing.T, c *http.Client, method, u, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(raw)
}

func post(t *testing.T, c *http.Client, u string, form url.Values, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// postPage posts a form and returns the answer with its page.
func postPage(t *testing.T, c *http.Client, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	res, err := c.PostForm(u, form)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(body)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]*)"`)

// csrf reads the token the page embeds in its forms.
func (e *env) csrf(t *testing.T, c *http.Client) string {
	t.Helper()
	res, body := get(t, c, e.srv.URL+"/ops")
	require.Equal(t, http.StatusOK, res.StatusCode)
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m, "no csrf field on the page")
	require.NotEmpty(t, m[1])
	return html.UnescapeString(m[1])
}

func (e *env) endpoint(t *testing.T, u string, types ...string) admin.Endpoint {
	t.Helper()
	ep, err := e.admin.CreateEndpoint(context.Background(), u, types)
	require.NoError(t, err)
	return ep
}

func (e *env) enqueue(t *testing.T, typ string, data any) []uuid.UUID {
	t.Helper()
	return e.enqueueKeyed(t, typ, "", data)
}

// enqueueKeyed writes an event with an ordering key ("" for none) and
// returns its messages' ids.
func (e *env) enqueueKeyed(t *testing.T, typ, key string, data any) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	var event uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) (err error) {
		event, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: typ, Data: data, OrderingKey: key})
		return err
	}))
	rows, err := e.pool.Query(ctx, "SELECT id FROM outbox_messages WHERE event_id = $1 ORDER BY id", event)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	return ids
}

// eventOf returns a message's event id: its webhook-id.
func (e *env) eventOf(t *testing.T, id uuid.UUID) uuid.UUID {
	t.Helper()
	var ev uuid.UUID
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT event_id FROM outbox_messages WHERE id = $1`, id).Scan(&ev))
	return ev
}

// park makes pending messages parked behind an earlier message of their
// key, as a claim would.
func (e *env) park(t *testing.T, ids ...uuid.UUID) {
	t.Helper()
	e.exec(t, `UPDATE outbox_messages SET parked = true WHERE id = ANY ($1) AND status = 'pending'`, ids)
}

func (e *env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// fail makes a message failed after three attempts, as the relay would.
func (e *env) fail(t *testing.T, id uuid.UUID) {
	t.Helper()
	e.exec(t, `UPDATE outbox_messages SET status = 'failed', failed_at = now(), attempts = 3,
		last_error = 'attempt 3 of 3: 500 Internal Server Error: receiver down' WHERE id = $1`, id)
	e.exec(t, `INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
		SELECT $1, n, CASE WHEN n = 3 THEN 'failed' ELSE 'retry' END,
		       now() - make_interval(mins => 4 - n), now() - make_interval(mins => 4 - n) + interval '12 ms',
		       500, '500 Internal Server Error: receiver down'
		FROM generate_series(1, 3) n`, id)
	deriveFromHistory(t, e.pool)
}

// deliver marks a message delivered on its first attempt.
func (e *env) deliver(t *testing.T, id uuid.UUID, ago time.Duration) {
	t.Helper()
	e.exec(t, `UPDATE outbox_messages SET status = 'delivered', attempts = 1, delivered_at = now() - $2::interval WHERE id = $1`,
		id, ago.String())
	e.exec(t, `INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
		VALUES ($1, 1, 'delivered', now() - $2::interval, now() - $2::interval + interval '8 ms', 204)`, id, ago.String())
	deriveFromHistory(t, e.pool)
}

// deriveFromHistory derives from outbox_attempts what the relay keeps beside
// the attempts it records: every endpoint's latest attempt, success and
// error, and the attempts' sums by minute. For tests that write attempts
// themselves.
func deriveFromHistory(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		UPDATE webhook_endpoints e
		SET last_attempt_at = l.attempt_at, last_attempt_outcome = l.attempt_outcome, last_success_at = l.success_at,
		    last_error_at = l.error_at, last_error_status_code = l.error_status_code, last_error = l.error
		FROM (
			SELECT m.destination,
			       max(a.finished_at) AS attempt_at,
			       (array_agg(a.outcome ORDER BY a.finished_at DESC))[1] AS attempt_outcome,
			       max(a.finished_at) FILTER (WHERE a.outcome = 'delivered') AS success_at,
			       max(a.finished_at) FILTER (WHERE a.outcome <> 'delivered') AS error_at,
			       (array_agg(a.status_code ORDER BY a.finished_at DESC) FILTER (WHERE a.outcome <> 'delivered'))[1] AS error_status_code,
			       (array_agg(a.error ORDER BY a.finished_at DESC) FILTER (WHERE a.outcome <> 'delivered'))[1] AS error
			FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
			GROUP BY m.destination
		) l
		WHERE e.id = l.destination;
		SELECT outbox_attempt_minutes_recount(now() - interval '2 days')`)
	require.NoError(t, err)
}

func (e *env) status(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT status FROM outbox_messages WHERE id = $1`, id).Scan(&s))
	return s
}

func (e *env) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func dataValue(t *testing.T, body, id string) int64 {
	t.Helper()
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*data-value="(\d+)"`).FindStringSubmatch(body)
	require.NotNil(t, m, "no %s on the page", id)
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return n
}

func TestWithoutTokenConfiguredEverythingIs403(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	c := e.browser(t)
	for _, p := range []string{"/ops", "/ops/", "/ops/login", "/ops/messages/" + uuid.NewString()} {
		res, body := get(t, c, e.srv.URL+p)
		require.Equal(t, http.StatusForbidden, res.StatusCode, p)
		require.Contains(t, body, "ADMIN_TOKEN")
	}
	// Not even an empty token logs in, with the form or the header.
	res := post(t, c, e.srv.URL+"/ops/login", url.Values{"token": {""}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Empty(t, res.Cookies())
	res, _ = get(t, c, e.srv.URL+"/ops", "Authorization", "Bearer ")
	require.Equal(t, http.StatusForbidden, res.StatusCode)
}

func TestUnauthenticatedIs401WithTheLoginForm(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	id := e.enqueue(t, "order.placed", map[string]int{"n": 1}) // no endpoint: none
	require.Empty(t, id)
	c := e.browser(t)
	for _, p := range []string{"/ops", "/ops/", "/ops/messages/" + uuid.NewString(), "/ops/nope"} {
		res, body := get(t, c, e.srv.URL+p)
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, p)
		require.Contains(t, body, `action="/ops/login"`, p)
		require.NotContains(t, body, `id="pending-count"`)
	}
	for _, p := range []string{"/ops/messages/" + uuid.NewString() + "/retry", "/ops/endpoints/" + uuid.NewString() + "/disable", "/ops/logout"} {
		res := post(t, c, e.srv.URL+p, url.Values{"confirm": {"yes"}})
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, p)
	}
	// A wrong bearer token, a wrong scheme, a forged cookie: all 401.
	res, _ := get(t, c, e.srv.URL+"/ops", "Authorization", "Bearer wrong")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	res, _ = get(t, c, e.srv.URL+"/ops", "Authorization", "Basic "+token)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	res, _ = get(t, c, e.srv.URL+"/ops", "Cookie", ops.CookieName+"="+token)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	// The right bearer token is enough, with no cookie.
	res, body := get(t, c, e.srv.URL+"/ops", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="pending-count"`)
	// The stylesheet needs no login (the login page uses it).
	res, body = get(t, c, e.srv.URL+"/ops/static/ops.css")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, res.Header.Get("Content-Type"), "text/css")
	require.Contains(t, body, ".kpi")
}

func TestLoginSetsASafeCookieAndLogoutEndsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.browser(t)

	res := post(t, c, e.srv.URL+"/ops/login", url.Values{"token": {"not-it"}})
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Empty(t, res.Cookies())

	res = post(t, c, e.srv.URL+"/ops/login", url.Values{"token": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops", res.Header.Get("Location"))
	cookies := res.Cookies()
	require.Len(t, cookies, 1)
	ck := cookies[0]
	require.Equal(t, ops.CookieName, ck.Name)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, "/ops", ck.Path)
	require.Positive(t, ck.MaxAge)
	require.NotContains(t, ck.Value, token, "the cookie must not carry the token")
	raw := res.Header.Get("Set-Cookie")
	require.Contains(t, raw, "HttpOnly")
	require.Contains(t, raw, "SameSite=Strict")

	res, body := get(t, c, e.srv.URL+"/ops")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `id="pending-count"`)
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'none'")
	// Already signed in: the login page sends you on.
	res, _ = get(t, c, e.srv.URL+"/ops/login")
	require.Equal(t, http.StatusSeeOther, res.StatusCode)

	// A tampered cookie is refused.
	tampered := e.browser(t)
	u, _ := url.Parse(e.srv.URL + "/ops")
	tampered.Jar.SetCookies(u, []*http.Cookie{{Name: ops.CookieName, Value: ck.Value[:len(ck.Value)-2] + "xx", Path: "/ops"}})
	res, _ = get(t, tampered, e.srv.URL+"/ops")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)

	// Logout needs its CSRF token, then clears the cookie.
	res = post(t, c, e.srv.URL+"/ops/logout", url.Values{})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	res = post(t, c, e.srv.URL+"/ops/logout", url.Values{"csrf": {e.csrf(t, c)}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops/login", res.Header.Get("Location"))
	require.Len(t, res.Cookies(), 1)
	require.Negative(t, res.Cookies()[0].MaxAge)
	res, _ = get(t, c, e.srv.URL+"/ops")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)

	require.NotContains(t, e.logs.String(), token, "the token must never be logged")
	require.Contains(t, e.logs.String(), `"msg":"ops login"`)
	require.Contains(t, e.logs.String(), `"msg":"ops login failed"`)
	require.Contains(t, e.logs.String(), `"msg":"ops logout"`)
}

func TestSessionExpires(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	admin := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := ops.New(ops.Options{Admin: admin, Pool: pool, Token: token, Now: clock, SessionTTL: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e := &env{srv: srv}
	c := e.loggedIn(t)
	res, _ := get(t, c, srv.URL+"/ops")
	require.Equal(t, http.StatusOK, res.StatusCode)
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	res, _ = get(t, c, srv.URL+"/ops")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
}

func TestActionsRefuseMissingOrWrongCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ep := e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	id := e.enqueue(t, "order.placed", map[string]int{"n": 1})[0]
	e.fail(t, id)

	c := e.loggedIn(t)
	other := e.loggedIn(t) // another session: its token must not work here
	otherCSRF := e.csrf(t, other)
	good := e.csrf(t, c)
	require.NotEqual(t, good, otherCSRF)

	retry := e.srv.URL + "/ops/messages/" + id.String() + "/retry"
	for name, form := range map[string]url.Values{
		"missing":       {"confirm": {"yes"}},
		"wrong":         {"confirm": {"yes"}, "csrf": {"AAAA"}},
		"other session": {"confirm": {"yes"}, "csrf": {otherCSRF}},
	} {
		res := post(t, c, retry, form)
		require.Equal(t, http.StatusForbidden, res.StatusCode, name)
		require.Equal(t, outbox.StatusFailed, e.status(t, id), name)
	}
	// Every endpoint action, each without and with a foreign token.
	epURL := e.srv.URL + "/ops/endpoints/" + ep.ID.String()
	for _, action := range []string{"/disable", "/enable", "/retry-failed", "/rotate-secret", "/discard-waiting", "/delete", "/edit", "/replay"} {
		for name, form := range map[string]url.Values{"missing": {"confirm": {"yes"}}, "other session": {"confirm": {"yes"}, "csrf": {otherCSRF}}} {
			res := post(t, c, epURL+action, form)
			require.Equal(t, http.StatusForbidden, res.StatusCode, "%s: %s", action, name)
		}
	}
	_, err := e.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET enabled = false WHERE id = $1`, ep.ID)
	require.NoError(t, err)
	res := post(t, c, epURL+"/enable", url.Values{"confirm": {"yes"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	got, err := e.admin.Endpoint(context.Background(), ep.ID)
	require.NoError(t, err)
	require.False(t, got.Enabled, "a refused resume leaves it paused")
	require.Equal(t, outbox.StatusFailed, e.status(t, id), "a refused retry-all leaves the message failed")
	require.Equal(t, int64(1), e.count(t, `SELECT count(*) FROM webhook_endpoints WHERE id = $1`, ep.ID), "a refused delete leaves it")

	// A cross-site POST is refused even with the right token.
	res = post(t, c, retry, url.Values{"confirm": {"yes"}, "csrf": {good}}, "Sec-Fetch-Site", "cross-site")
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Equal(t, outbox.StatusFailed, e.status(t, id))

	// Actions are POST only: a GET changes nothing.
	res, _ = get(t, c, retry+"?confirm=yes&csrf="+url.QueryEscape(good))
	require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, res.StatusCode)
	require.Equal(t, outbox.StatusFailed, e.status(t, id))

	// The bearer header needs no CSRF token: a browser never sends it by itself.
	res = post(t, e.browser(t), retry, url.Values{"confirm": {"yes"}}, "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, outbox.StatusPending, e.status(t, id))
	require.Contains(t, e.logs.String(), `"auth":"bearer"`)
}

func TestOverviewNumbersMatchTheDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	good := e.endpoint(t, "http://127.0.0.1:9/good", "order.placed")
	bad := e.endpoint(t, "http://127.0.0.1:9/bad", "order.cancelled")
	off := e.endpoint(t, "http://127.0.0.1:9/off", "order.placed")
	var failed []uuid.UUID
	for i := range 7 {
		ids := e.enqueue(t, "order.placed", map[string]int{"n": i}) // good + off
		if i < 5 {
			for _, id := range ids {
				e.deliver(t, id, time.Duration(i)*7*time.Minute+time.Minute)
			}
		}
	}
	for i := range 3 {
		failed = append(failed, e.enqueue(t, "order.cancelled", map[string]int{"n": i})...)
	}
	e.fail(t, failed[0])
	e.fail(t, failed[1])
	// failed[2] is backing off after an error.
	e.exec(t, `UPDATE outbox_messages SET attempts = 1, next_attempt_at = now() + interval '5 minutes', last_error = '503 Service Unavailable' WHERE id = $1`, failed[2])
	e.exec(t, `INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code, error)
		VALUES ($1, 1, 'retry', now() - interval '10 s', now() - interval '9 s', 503, '503 Service Unavailable')`, failed[2])
	deriveFromHistory(t, e.pool)
	e.exec(t, `UPDATE outbox_messages SET created_at = now() - interval '2 hours 3 minutes' WHERE id = $1`, failed[2])
	_, err := e.admin.SetEndpointEnabled(context.Background(), off.ID, false)
	require.NoError(t, err)
	// An endpoint failing as a whole, backing off until its next probe.
	down := e.endpoint(t, "http://127.0.0.1:9/down", "order.shipped")
	e.exec(t, `UPDATE webhook_endpoints SET health = 'backing_off', health_reason = 'connect: connection refused',
		health_changed_at = now() - interval '3 minutes', consecutive_failures = 7, backoff_until = now() + interval '40 seconds'
		WHERE id = $1`, down.ID)

	c := e.loggedIn(t)
	res, body := get(t, c, e.srv.URL+"/ops")
	require.Equal(t, http.StatusOK, res.StatusCode)

	require.Equal(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE status = 'pending'`), dataValue(t, body, "pending-count"))
	require.Equal(t, int64(5), dataValue(t, body, "pending-count")) // 2 placed × 2 endpoints + 1 backing off
	require.Equal(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE status = 'failed'`), dataValue(t, body, "failed-count"))
	require.Equal(t, int64(2), dataValue(t, body, "failed-count"))
	require.Equal(t, e.count(t, `SELECT count(*) FROM outbox_attempts WHERE outcome = 'delivered' AND finished_at >= now() - interval '1 hour'`),
		dataValue(t, body, "delivered-60m"))
	require.Contains(t, body, "2h 03m", "oldest pending age, human-friendly")

	// The chart is inline SVG with an accessible title and description.
	require.Contains(t, body, `<svg class="chart chart-deliveries"`)
	require.Contains(t, body, `<title id="deliveries-title">`)
	require.Contains(t, body, `<desc id="deliveries-desc">`)
	require.Contains(t, body, "10 delivered, 5 retried, 2 failed in all") // 5 deliveries × 2 endpoints; 2×2 + 1 retries
	require.Contains(t, body, `class="seg-delivered"`)
	require.Contains(t, body, `class="seg-failed"`)
	require.Contains(t, body, "5 waiting now")

	// Endpoints: health, waiting, failed, last error.
	row := func(id uuid.UUID) string {
		i := strings.Index(body, `id="endpoint-`+id.String()+`"`)
		require.Positive(t, i)
		j := strings.Index(body[i:], "</tr>")
		return body[i : i+j]
	}
	require.Contains(t, row(good.ID), `data-health="healthy"`)
	require.Contains(t, row(good.ID), `data-waiting="2"`)
	require.Contains(t, row(bad.ID), `data-health="healthy"`, "single messages retrying on their schedule")
	require.Contains(t, row(bad.ID), "1 retrying")
	require.Contains(t, row(bad.ID), `data-waiting="1"`)
	require.Contains(t, row(bad.ID), `data-failed="2"`)
	require.Contains(t, row(bad.ID), "503 Service Unavailable")
	require.Contains(t, row(bad.ID), "retry-failed")
	require.Contains(t, row(off.ID), `data-health="paused"`)
	require.Contains(t, row(off.ID), "Resume")
	require.Contains(t, row(down.ID), `data-health="backing_off"`)
	require.Contains(t, row(down.ID), "connect: connection refused")
	require.Regexp(t, `next probe in (39|40)s`, row(down.ID))
	require.Contains(t, row(down.ID), "Probe now")
	require.Contains(t, row(off.ID), "/enable")

	// Failed messages, each with its error and a Retry form.
	for _, id := range failed[:2] {
		require.Contains(t, body, `id="failed-`+id.String()+`"`)
		require.Contains(t, body, `action="/ops/messages/`+id.String()+`/retry"`)
	}
	require.Contains(t, body, "receiver down")
	require.NotContains(t, body, "<script")
}

func TestRetryIsConfirmedThenMovesFailedToPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	id := e.enqueue(t, "order.placed", map[string]int{"n": 1})[0]
	e.fail(t, id)
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	retry := e.srv.URL + "/ops/messages/" + id.String() + "/retry"

	// First step: a confirmation page, nothing changed.
	req, _ := http.NewRequest(http.MethodPost, retry, strings.NewReader(url.Values{"csrf": {csrf}, "return": {"/ops"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := c.Do(req)
	require.NoError(t, err)
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(page), `name="confirm" value="yes"`)
	require.Contains(t, string(page), "receiver down")
	require.Equal(t, outbox.StatusFailed, e.status(t, id))

	// Second step: requeued, logged, and back to where we came from.
	res = post(t, c, retry, url.Values{"csrf": {csrf}, "confirm": {"yes"}, "return": {"/ops"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=retried", res.Header.Get("Location"))
	require.Equal(t, outbox.StatusPending, e.status(t, id))
	require.Zero(t, e.count(t, `SELECT attempts FROM outbox_messages WHERE id = $1`, id))
	logs := e.logs.String()
	require.Contains(t, logs, `"msg":"ops action","action":"retry_message","auth":"cookie"`)
	require.Contains(t, logs, `"message_id":"`+id.String()+`"`)
	require.NotContains(t, logs, token)

	_, body := get(t, c, e.srv.URL+"/ops?done=retried")
	require.Contains(t, body, "Message requeued")
	require.Zero(t, dataValue(t, body, "failed-count"))

	// Retrying again: it is not failed any more.
	res = post(t, c, retry, url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusConflict, res.StatusCode)
	// An open redirect is not possible through return.
	e.fail(t, e.enqueue(t, "order.placed", map[string]int{"n": 2})[0])
	var other uuid.UUID
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT id FROM outbox_messages WHERE status = 'failed'`).Scan(&other))
	for _, ret := range []string{"https://evil.example/", "//evil.example/ops", "/elsewhere", `/\evil.example`,
		"/ops/../%5Cevil.example", "/ops/../%09/evil.example", "/ops/../orders", "/ops/..//evil.example", "ops/x"} {
		e.exec(t, `UPDATE outbox_messages SET status = 'failed', failed_at = now() WHERE id = $1`, other)
		res = post(t, c, e.srv.URL+"/ops/messages/"+other.String()+"/retry", url.Values{"csrf": {csrf}, "confirm": {"yes"}, "return": {ret}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, "/ops?done=retried", res.Header.Get("Location"), ret)
	}
	res = post(t, c, e.srv.URL+"/ops/messages/"+uuid.NewString()+"/retry", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

func TestDisableAndEnableAnEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ep := e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)
	base := e.srv.URL + "/ops/endpoints/" + ep.ID.String()

	res := post(t, c, base+"/disable", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusOK, res.StatusCode) // the confirmation page
	got, _ := e.admin.Endpoint(context.Background(), ep.ID)
	require.True(t, got.Enabled)

	res = post(t, c, base+"/disable", url.Values{"csrf": {csrf}, "confirm": {"yes"}, "return": {"/ops"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=disabled", res.Header.Get("Location"))
	got, _ = e.admin.Endpoint(context.Background(), ep.ID)
	require.False(t, got.Enabled)
	require.Equal(t, "disabled by an operator", got.DisabledReason)
	_, body := get(t, c, e.srv.URL+"/ops")
	require.Contains(t, body, `data-health="paused"`)
	require.Contains(t, body, "/ops/endpoints/"+ep.ID.String()+"/enable")
	require.Len(t, e.enqueue(t, "order.placed", 1), 1, "a paused endpoint's messages are kept")

	res = post(t, c, base+"/enable", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	got, _ = e.admin.Endpoint(context.Background(), ep.ID)
	require.True(t, got.Enabled)
	require.Len(t, e.enqueue(t, "order.placed", 1), 1)

	logs := e.logs.String()
	require.Contains(t, logs, `"action":"disable_endpoint"`)
	require.Contains(t, logs, `"action":"enable_endpoint"`)
	require.Contains(t, logs, `"endpoint_id":"`+ep.ID.String()+`"`)

	res = post(t, c, e.srv.URL+"/ops/endpoints/"+uuid.NewString()+"/disable", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

func TestRetryAllFailedForOneEndpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	a := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	b := e.endpoint(t, "http://127.0.0.1:9/b", "order.placed")
	var ofA, ofB []uuid.UUID
	for i := range 3 {
		for _, id := range e.enqueue(t, "order.placed", map[string]int{"n": i}) {
			e.fail(t, id)
			var dest uuid.UUID
			require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT destination FROM outbox_messages WHERE id = $1`, id).Scan(&dest))
			if dest == a.ID {
				ofA = append(ofA, id)
			} else {
				ofB = append(ofB, id)
			}
		}
	}
	require.Len(t, ofA, 3)
	c := e.loggedIn(t)
	csrf := e.csrf(t, c)

	// First the question, which counts them and changes nothing.
	res, body := postPage(t, c, e.srv.URL+"/ops/endpoints/"+a.ID.String()+"/retry-failed", url.Values{"csrf": {csrf}, "return": {"/ops"}})
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "Retry all failed messages?")
	require.Contains(t, body, "<dt>Failed messages</dt><dd>3</dd>")
	for _, id := range ofA {
		require.Equal(t, outbox.StatusFailed, e.status(t, id), "nothing changes before the confirmation")
	}
	res = post(t, c, e.srv.URL+"/ops/endpoints/"+a.ID.String()+"/retry-failed", hiddenFields(body))
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ops?done=retried_all&n=3", res.Header.Get("Location"))
	for _, id := range ofA {
		require.Equal(t, outbox.StatusPending, e.status(t, id))
	}
	for _, id := range ofB {
		require.Equal(t, outbox.StatusFailed, e.status(t, id), "another endpoint's messages stay failed")
	}
	require.Contains(t, e.logs.String(), `"action":"retry_failed_for_endpoint"`)
	require.Contains(t, e.logs.String(), `"requeued":3`)
	_, body = get(t, c, e.srv.URL+"/ops?done=retried_all&n=3")
	require.Contains(t, body, "3 failed messages requeued")
	require.Equal(t, int64(3), dataValue(t, body, "failed-count"))
	_ = b
}

func TestMessageDetail(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, func(o *ops.Options) { o.UserAgent = "shop-relay/1" })
	ep := e.endpoint(t, "http://127.0.0.1:9/hook", "order.placed")
	id := e.enqueue(t, "order.placed", map[string]any{"order_id": "o-1", "total_cents": 1000, "note": "<b>bold</b>"})[0]
	e.fail(t, id)
	c := e.loggedIn(t)

	event := e.eventOf(t, id)
	require.NotEqual(t, id, event)
	// The payload is sent as written (json, not jsonb), and Enqueue's
	// encoder escapes markup; one written otherwise may hold it raw.
	e.exec(t, `UPDATE outbox_events SET payload = '{"order_id": "o-1", "total_cents": 1000, "note": "<b>bold</b>"}' WHERE id = $1`, event)

	res, body := get(t, c, e.srv.URL+"/ops/messages/"+id.String())
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `data-status="failed"`)
	require.Contains(t, body, ep.URL)
	// The event and this delivery of it, each under its own id.
	require.Contains(t, body, `id="event-id">`+event.String()+`<`)
	require.Contains(t, body, `id="delivery-id">`+id.String()+`<`)
	require.NotContains(t, body, `id="ordering-key"`, "no ordering key, none shown")
	require.NotContains(t, body, `id="holding"`)
	// The body as sent, indented, and escaped: its id is the event's.
	require.Contains(t, body, `&#34;id&#34;: &#34;`+event.String()+`&#34;`)
	require.NotContains(t, body, `&#34;id&#34;: &#34;`+id.String()+`&#34;`)
	require.Contains(t, body, `  &#34;data&#34;: {`)
	require.Contains(t, body, `&#34;total_cents&#34;: 1000`)
	// The payload's markup is shown as text, never rendered.
	require.Contains(t, body, `&lt;b&gt;bold&lt;/b&gt;`)
	require.NotContains(t, body, "<b>bold</b>")
	// The headers that are sent.
	for _, h := range []string{"content-type", "application/json", "webhook-id", "webhook-timestamp", "webhook-signature", "computed for each attempt"} {
		require.Contains(t, body, h)
	}
	// The sender as the relay names it: the service's, whatever the template's.
	require.Regexp(t, `user-agent</th><td><span class="mono">shop-relay/1</span>`, body)
	// webhook-id is the event id, not the message's.
	require.Regexp(t, `webhook-id</th><td><span class="mono">`+event.String()+`</span><div class="sub">the event id: the same on every attempt and at every endpoint; receivers deduplicate on it</div>`, body)
	// The attempt history.
	require.Equal(t, 2, strings.Count(body, `data-outcome="retry"`))
	require.Equal(t, 1, strings.Count(body, `data-outcome="failed"`))
	require.Contains(t, body, "12.0 ms")
	require.Contains(t, body, `action="/ops/messages/`+id.String()+`/retry"`)
	require.Contains(t, body, `action="/ops/messages/`+id.String()+`/skip"`)
	require.NotContains(t, body, ep.Secret, "the secret is never shown")
	require.NotContains(t, body, "Next attempt", "a failed message has none")

	// A pending message shows its next attempt; a delivered one no action.
	pending := e.enqueue(t, "order.placed", map[string]int{"n": 2})[0]
	_, body = get(t, c, e.srv.URL+"/ops/messages/"+pending.String())
	require.Contains(t, body, "<dt>Next attempt</dt>")
	require.NotContains(t, body, "parked")
	require.NotContains(t, body, `id="retry"`)
	require.NotContains(t, body, `id="skip"`)

	res, _ = get(t, c, e.srv.URL+"/ops/messages/"+uuid.NewString())
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	res, _ = get(t, c, e.srv.URL+"/ops/messages/not-a-uuid")
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

// A message's and an endpoint's pages have one address each: spellings of
// the id other than the canonical one are not found.
func TestPagesAnswerOnlyTheCanonicalID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ep := e.endpoint(t, "http://127.0.0.1:9/a", "order.placed")
	msg := e.enqueue(t, "order.placed", 1)[0]
	c := e.loggedIn(t)
	for _, page := range []string{"/ops/messages/", "/ops/endpoints/"} {
		id := msg.String()
		if page == "/ops/endpoints/" {
			id = ep.ID.String()
		}
		res, _ := get(t, c, e.srv.URL+page+strings.ToUpper(id))
		require.Equal(t, http.StatusOK, res.StatusCode, "%s in upper case", page)
		for _, other := range []string{"urn:uuid:" + id, "%7B" + id + "%7D", strings.ReplaceAll(id, "-", "")} {
			res, _ := get(t, c, e.srv.URL+page+other)
			require.Equal(t, http.StatusNotFound, res.StatusCode, page+other)
		}
	}
}
