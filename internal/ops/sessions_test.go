package ops_test

import (
	"context"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/proctest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/ops"
)

// opsServer serves an ops page on pool with a clock the test moves.
type opsServer struct {
	srv   *httptest.Server
	h     *ops.Handler
	logs  *proctest.Output
	mu    sync.Mutex
	now   time.Time
	admin *admin.Service
}

func newOpsServer(t *testing.T, pool *pgxpool.Pool, secure bool) *opsServer {
	t.Helper()
	s := &opsServer{now: time.Now()}
	s.admin = admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	s.logs = &proctest.Output{}
	s.h = ops.New(ops.Options{Admin: s.admin, Pool: pool, Token: token, CookieSecure: secure, SessionTTL: time.Hour,
		Logger: process.NewLogger(s.logs, "json"), Now: func() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.now }})
	s.srv = httptest.NewServer(s.h)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *opsServer) advance(d time.Duration) {
	s.mu.Lock()
	s.now = s.now.Add(d)
	s.mu.Unlock()
}

// login posts the form with tok and returns the answer and its session cookie
// (nil when none was set).
func (s *opsServer) login(t *testing.T, tok string) (*http.Response, *http.Cookie) {
	t.Helper()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res := post(t, c, s.srv.URL+"/ops/login", url.Values{"token": {tok}})
	for _, ck := range res.Cookies() {
		if ck.Name == ops.CookieName && ck.MaxAge > 0 {
			return res, ck
		}
	}
	return res, nil
}

// withCookie requests path with the given cookie value, as a replaying
// client would, whatever the browser did with it since.
func (s *opsServer) withCookie(t *testing.T, path, value string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.srv.URL+path, nil)
	require.NoError(t, err)
	req.AddCookie(&http.Cookie{Name: ops.CookieName, Value: value})
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

// Behind a proxy that terminates TLS the api sees plain HTTP; the cookie is
// still Secure when configured so, and not otherwise.
func TestSessionCookieIsSecureWhenConfigured(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	for _, secure := range []bool{true, false} {
		s := newOpsServer(t, pool, secure)
		res, ck := s.login(t, token)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.NotNil(t, ck, "a login sets the session cookie")
		require.Equal(t, secure, ck.Secure, "the cookie over plain HTTP is Secure exactly when CookieSecure is set")
		require.True(t, ck.HttpOnly)
		require.NotContains(t, ck.Value, token, "the cookie never holds the token")
	}
}

// Five wrong tokens from one address in a minute are answered 401; from the
// sixth on the address's wrong tokens get 429 with Retry-After until the
// minute is over, in the form and as a bearer header. The right token
// always gets in: otherwise anyone could lock the operator out.
func TestFailedLoginsAreThrottled(t *testing.T) {
	t.Parallel()
	s := newOpsServer(t, dbtest.Pool(t), false)
	for i := range 5 {
		res, ck := s.login(t, "wrong")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "failed login %d is refused, not yet throttled", i+1)
		require.Nil(t, ck)
	}
	res, _ := s.login(t, "wrong")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the sixth failed login in a minute is throttled")
	require.Equal(t, "60", res.Header.Get("Retry-After"), "the client is told when to come back")
	got, _ := get(t, http.DefaultClient, s.srv.URL+"/ops", "Authorization", "Bearer wrong")
	require.Equal(t, http.StatusTooManyRequests, got.StatusCode, "the bearer header is throttled like the form")

	res, ck := s.login(t, token)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "while throttled the right token still logs in")
	require.NotNil(t, ck)
	got, _ = get(t, http.DefaultClient, s.srv.URL+"/ops", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, got.StatusCode, "and works as a bearer header")

	s.advance(30 * time.Second)
	res, _ = s.login(t, "wrong")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Equal(t, "30", res.Header.Get("Retry-After"))

	s.advance(30 * time.Second)
	res, _ = s.login(t, "wrong")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, "after the window a wrong token is counted again")
}

// Wrong bearer tokens count as failed logins too.
func TestWrongBearerTokensAreThrottled(t *testing.T) {
	t.Parallel()
	s := newOpsServer(t, dbtest.Pool(t), false)
	for i := range 5 {
		res, _ := get(t, http.DefaultClient, s.srv.URL+"/ops", "Authorization", "Bearer wrong")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "wrong bearer token %d", i+1)
	}
	res, _ := get(t, http.DefaultClient, s.srv.URL+"/ops", "Authorization", "Bearer wrong")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the sixth wrong bearer token in a minute is throttled")
	res, _ = s.login(t, "wrong")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "and so is the form from the same address")
}

// The admin API checks its bearer token as the page does, under the same
// throttle: wrong tokens are logged and, past the limit, answered 429; the
// right one always gets through; no token at all is refused uncounted.
func TestAdminAPITokenSharesTheThrottle(t *testing.T) {
	t.Parallel()
	s := newOpsServer(t, dbtest.Pool(t), false)
	api := httptest.NewServer(s.h.RequireToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	t.Cleanup(api.Close)
	for range 10 {
		res, _ := get(t, http.DefaultClient, api.URL)
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "no token: refused, not counted")
	}
	for i := range 5 {
		res, _ := get(t, http.DefaultClient, api.URL, "Authorization", "Bearer wrong")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "wrong token %d", i+1)
	}
	res, _ := get(t, http.DefaultClient, api.URL, "Authorization", "Bearer wrong")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.NotEmpty(t, res.Header.Get("Retry-After"))
	res, _ = s.login(t, "wrong")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the page's form counts the API's failures")
	res, _ = get(t, http.DefaultClient, api.URL, "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusNoContent, res.StatusCode, "the right token gets through")
	require.Equal(t, 5, strings.Count(s.logs.String(), "admin request refused: wrong bearer token"), "each counted failure logged once")
}

// An Authorization header of another scheme (Basic, added by a proxy that
// authenticates its users) is not ours: the session cookie still decides,
// and no request counts as a failed login. The Bearer scheme's name is
// case-insensitive.
func TestOtherAuthorizationSchemesLeaveTheSessionAlone(t *testing.T) {
	t.Parallel()
	s := newOpsServer(t, dbtest.Pool(t), false)
	_, ck := s.login(t, token)
	require.NotNil(t, ck)
	for i := range 10 {
		req, err := http.NewRequest(http.MethodGet, s.srv.URL+"/ops", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
		req.AddCookie(&http.Cookie{Name: ops.CookieName, Value: ck.Value})
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, "request %d: the cookie's session, whatever the proxy's Basic header", i+1)
	}
	res, _ := get(t, http.DefaultClient, s.srv.URL+"/ops", "Authorization", "Basic dXNlcjpwYXNz")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, "without the cookie, Basic is no login")
	res, _ = get(t, http.DefaultClient, s.srv.URL+"/ops", "Authorization", "bearer "+token)
	require.Equal(t, http.StatusOK, res.StatusCode, "not throttled, and the scheme's name is case-insensitive")
}

// Logging out ends the session on the server: the old cookie value, replayed,
// is refused by the process that logged it out and by any other api process
// on the same database. Changing the admin token ends every session.
func TestLogoutEndsTheSessionInEveryProcess(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	a, b := newOpsServer(t, pool, false), newOpsServer(t, pool, false)
	res, ck := a.login(t, token)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, http.StatusOK, a.withCookie(t, "/ops", ck.Value))
	require.Equal(t, http.StatusOK, b.withCookie(t, "/ops", ck.Value), "a session works on every api process")

	jar := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	u, err := url.Parse(a.srv.URL)
	require.NoError(t, err)
	jar.Jar = &fixedJar{cookies: []*http.Cookie{{Name: ops.CookieName, Value: ck.Value}}}
	_, body := get(t, jar, a.srv.URL+"/ops")
	m := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, m)
	res = post(t, jar, u.String()+"/ops/logout", url.Values{"csrf": {html.UnescapeString(m[1])}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)

	require.Equal(t, http.StatusUnauthorized, a.withCookie(t, "/ops", ck.Value), "the logged-out cookie, replayed, is refused")
	require.Equal(t, http.StatusUnauthorized, b.withCookie(t, "/ops", ck.Value), "and refused by the other process too")
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM ops_sessions").Scan(&n))
	require.Zero(t, n, "logout deleted the session row")

	// A session issued under one admin token is nothing under another.
	_, ck = a.login(t, token)
	other := ops.New(ops.Options{Admin: a.admin, Pool: pool, Token: token + "-rotated", Logger: slog.New(slog.DiscardHandler)})
	srv := httptest.NewServer(other)
	t.Cleanup(srv.Close)
	rotated := &opsServer{srv: srv}
	require.Equal(t, http.StatusUnauthorized, rotated.withCookie(t, "/ops", ck.Value), "changing ADMIN_TOKEN ends every session")
}

// Expired sessions are refused, and deleted at the next login.
func TestExpiredSessionsArePruned(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	s := newOpsServer(t, pool, false)
	_, old := s.login(t, token)
	s.advance(2 * time.Hour)
	require.Equal(t, http.StatusUnauthorized, s.withCookie(t, "/ops", old.Value), "a session past its TTL is refused")
	_, fresh := s.login(t, token)
	require.Equal(t, http.StatusOK, s.withCookie(t, "/ops", fresh.Value))
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM ops_sessions").Scan(&n))
	require.Equal(t, 1, n, "the login deleted the expired session")
}

// fixedJar sends the same cookies with every request and keeps none.
type fixedJar struct{ cookies []*http.Cookie }

func (j *fixedJar) SetCookies(*url.URL, []*http.Cookie) {}
func (j *fixedJar) Cookies(*url.URL) []*http.Cookie     { return j.cookies }

// Signing in goes back to the page that asked for it, query included, and
// never anywhere else: another site, a scheme, or a path outside the ops
// page lands on the overview.
func TestLoginReturnsToThePageAsked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.browser(t)
	asked := "/ops/messages?status=failed&type=order.placed"
	res, body := get(t, c, e.srv.URL+asked)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Contains(t, body, `<input type="hidden" name="next" value="/ops/messages?status=failed&amp;type=order.placed">`)
	res = post(t, c, e.srv.URL+"/ops/login", url.Values{"token": {token}, "next": {asked}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, asked, res.Header.Get("Location"))

	for _, evil := range []string{"https://evil.example/ops", "//evil.example/ops", "/\\evil.example", "/elsewhere",
		"javascript:alert(1)", "/ops/../admin", "/ops/login", "http:/ops"} {
		res := post(t, e.browser(t), e.srv.URL+"/ops/login", url.Values{"token": {token}, "next": {evil}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, evil)
		require.Equal(t, "/ops", res.Header.Get("Location"), evil)
	}
}
