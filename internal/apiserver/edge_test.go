package apiserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
)

const orderBody = `{"customer_id":"c-1","lines":[{"sku":"sku-1","quantity":1,"unit_price_cents":100}]}`

// send sends a request with exactly the given headers (Host among them,
// in place of the target's) and returns the response with its body read.
func send(t *testing.T, method, target string, headers map[string]string, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	client := contracttest.Client(t, &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}})
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// requireProblem checks an error answer: its status, and a problem+json
// body whose detail contains want.
func requireProblem(t *testing.T, resp *http.Response, body []byte, status int, want string) {
	t.Helper()
	require.Equal(t, status, resp.StatusCode, "body: %s", body)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"), "errors are problem details: %s", body)
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(body, &p), "body: %s", body)
	require.Equal(t, status, p.Status)
	require.Contains(t, p.Detail, want)
}

// counts is what a refused request must not change.
type counts struct{ orders, messages, events, endpoints int }

func countRows(t *testing.T, conn *pgx.Conn) counts {
	t.Helper()
	var c counts
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_messages),
		(SELECT count(*) FROM outbox_events), (SELECT count(*) FROM webhook_endpoints)`).
		Scan(&c.orders, &c.messages, &c.events, &c.endpoints))
	return c
}

// Browsers: a page on another site must not be able to change anything,
// whether it posts a form (no CORS preflight) or JSON, and the JSON API
// takes no form bodies from a browser at all. Clients that are not browsers
// (no Origin, no Sec-Fetch-*) keep working, including curl's default form
// content type.
func TestBrowserRequestsThatChangeStateAreRefused(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	s := setup(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": strings.Repeat("k", 32), "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	// An order placed by a client that is not a browser, for the cancels.
	resp, body := send(t, http.MethodPost, s.url+"/orders", map[string]string{"Content-Type": "application/json"}, orderBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", body)
	var placed struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(body, &placed))

	const evil = "https://evil.example"
	crossSiteForm := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": evil,
		"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
	sameOriginForm := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": s.url,
		"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
	// A browser too old for Sec-Fetch-* still sends Origin.
	oldBrowserForm := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": evil}
	crossSiteJSON := map[string]string{"Content-Type": "application/json", "Origin": evil,
		"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
	crossSiteText := map[string]string{"Content-Type": "text/plain;charset=UTF-8", "Origin": evil,
		"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"}
	bearer := "Bearer " + strings.Repeat("k", 32)
	withBearer := func(h map[string]string) map[string]string {
		out := map[string]string{"Authorization": bearer}
		for k, v := range h {
			out[k] = v
		}
		return out
	}
	endpoint := `{"url":"http://127.0.0.1:9/hooks","event_types":["order.placed"]}`
	cancel := "/orders/" + placed.ID + "/cancel"

	refused := []struct {
		name    string
		path    string
		headers map[string]string
		body    string
		status  int
		detail  string
	}{
		{"cross-site form to place", "/orders", crossSiteForm, orderBody, http.StatusForbidden, "cross-origin"},
		{"old browser's cross-site form to place", "/orders", oldBrowserForm, orderBody, http.StatusForbidden, "cross-origin"},
		{"cross-site no-cors text to place", "/orders", crossSiteText, orderBody, http.StatusForbidden, "cross-origin"},
		{"cross-site JSON to place", "/orders", crossSiteJSON, orderBody, http.StatusForbidden, "cross-origin"},
		{"same-origin form to place", "/orders", sameOriginForm, orderBody, http.StatusUnsupportedMediaType, "from a browser"},
		{"cross-site form to cancel", cancel, crossSiteForm, "", http.StatusForbidden, "cross-origin"},
		{"old browser's cross-site form to cancel", cancel, oldBrowserForm, "", http.StatusForbidden, "cross-origin"},
		{"cross-site JSON to cancel", cancel, crossSiteJSON, "", http.StatusForbidden, "cross-origin"},
		{"same-origin form to cancel", cancel, sameOriginForm, "x=1", http.StatusUnsupportedMediaType, "from a browser"},
		{"cross-site JSON to an admin route, with the token", "/webhook-endpoints", withBearer(crossSiteJSON), endpoint, http.StatusForbidden, "cross-origin"},
		{"same-origin form to an admin route, with the token", "/webhook-endpoints", withBearer(sameOriginForm), endpoint, http.StatusUnsupportedMediaType, "from a browser"},
		{"cross-site form to the ops login", "/ops/login", crossSiteForm, "token=" + strings.Repeat("k", 32), http.StatusForbidden, "cross-origin"},
	}
	before := countRows(t, conn)
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := send(t, http.MethodPost, s.url+tc.path, tc.headers, tc.body)
			requireProblem(t, resp, body, tc.status, tc.detail)
			require.Empty(t, resp.Cookies(), "a refused login sets no session")
			require.Equal(t, before, countRows(t, conn), "a refused request writes nothing")
			var status string
			require.NoError(t, conn.QueryRow(context.Background(), "SELECT status FROM orders WHERE id = $1", placed.ID).Scan(&status))
			require.Equal(t, placed.Status, status, "the order is not cancelled")
		})
	}

	allowed := []struct {
		name    string
		path    string
		headers map[string]string
		body    string
		status  int
	}{
		{"same-origin JSON places", "/orders", map[string]string{"Content-Type": "application/json", "Origin": s.url,
			"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}, orderBody, http.StatusCreated},
		{"curl's default form content type places", "/orders", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, orderBody, http.StatusCreated},
		{"no content type places", "/orders", nil, orderBody, http.StatusCreated},
		{"a client that is not a browser cancels", cancel, nil, "", http.StatusOK},
		{"same-origin ops login form signs in", "/ops/login", sameOriginForm, url.Values{"token": {strings.Repeat("k", 32)}}.Encode(), http.StatusSeeOther},
	}
	for _, tc := range allowed {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := send(t, http.MethodPost, s.url+tc.path, tc.headers, tc.body)
			require.Equal(t, tc.status, resp.StatusCode, "body: %s", body)
		})
	}
}

// The router's own errors (no such route, wrong method), on the api's mux
// and on the modules' muxes behind it, are problem details like the rest.
func TestRouterErrorsAreProblems(t *testing.T) {
	t.Parallel()
	s := setup(t, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		detail       string
	}{
		{http.MethodGet, "/nope", http.StatusNotFound, "no route for GET /nope"},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed, "method POST is not allowed on /healthz"},
		{http.MethodGet, "/orders", http.StatusMethodNotAllowed, "allowed: POST"},
		{http.MethodDelete, "/orders/0197a4c6-6b3c-7b1e-8f00-000000000001", http.StatusMethodNotAllowed, "method DELETE"},
		{http.MethodGet, "/orders/0197a4c6-6b3c-7b1e-8f00-000000000001/nope", http.StatusNotFound, "no route"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp, body := send(t, tc.method, s.url+tc.path, nil, "")
			requireProblem(t, resp, body, tc.status, tc.detail)
		})
	}
}

// With ADMIN_ADDR the admin surface (ops page, admin routes, /metrics)
// moves to its own listener: the public one serves the orders API and the
// probes only, and answers 404 for the admin paths.
func TestAdminAddrSplitsTheRoutes(t *testing.T) {
	t.Parallel()
	adminAddr := proctest.FreeAddr(t)
	token := strings.Repeat("t", 40)
	s := setup(t, map[string]string{"ADMIN_ADDR": adminAddr, "ADMIN_TOKEN": token})
	admin := "http://" + adminAddr
	auth := map[string]string{"Authorization": "Bearer " + token}

	resp, body := send(t, http.MethodPost, s.url+"/orders", map[string]string{"Content-Type": "application/json"}, orderBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the public listener serves the orders API: %s", body)
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, _ = send(t, http.MethodGet, s.url+p, nil, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "the public listener serves %s", p)
	}
	for _, p := range []string{"/outbox/stats", "/webhook-endpoints", "/ops", "/ops/", "/metrics"} {
		resp, body = send(t, http.MethodGet, s.url+p, auth, "")
		requireProblem(t, resp, body, http.StatusNotFound, "no route")

		resp, body = send(t, http.MethodGet, admin+p, auth, "")
		require.Equal(t, http.StatusOK, resp.StatusCode, "the admin listener serves %s: %s", p, body)
	}
	resp, body = send(t, http.MethodPost, admin+"/orders", map[string]string{"Content-Type": "application/json"}, orderBody)
	requireProblem(t, resp, body, http.StatusNotFound, "no route")

	require.NoError(t, s.stop(), "both listeners shut down")
	_, err := http.Get(admin + "/metrics")
	require.Error(t, err, "the admin listener is closed after Run returns")
}

// /metrics on the listener the orders API shares (no ADMIN_ADDR) is admin
// surface like the rest: without the token it tells nothing (it told
// anyone who could place an order the backlog, the endpoints' states and
// how each admin route and login answered), without ADMIN_TOKEN it is
// closed; on ADMIN_ADDR's private listener Prometheus scrapes it as before.
func TestMetricsOnThePublicListenerNeedTheAdminToken(t *testing.T) {
	t.Parallel()
	tok := strings.Repeat("m", 32)
	auth := map[string]string{"Authorization": "Bearer " + tok}

	shared := setup(t, map[string]string{"ADMIN_TOKEN": tok})
	resp, body := send(t, http.MethodGet, shared.url+"/metrics", nil, "")
	requireProblem(t, resp, body, http.StatusUnauthorized, "admin bearer token")
	require.NotContains(t, string(body), "outbox_", "nothing of the metrics without the token")
	resp, body = send(t, http.MethodGet, shared.url+"/metrics", map[string]string{"Authorization": "Bearer wrong"}, "")
	requireProblem(t, resp, body, http.StatusUnauthorized, "admin bearer token")
	resp, body = send(t, http.MethodGet, shared.url+"/metrics", auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), "outbox_backlog_scrape_success", "the token reads them")

	closed := setup(t, nil)
	resp, body = send(t, http.MethodGet, closed.url+"/metrics", nil, "")
	requireProblem(t, resp, body, http.StatusForbidden, "ADMIN_TOKEN")

	adminAddr := proctest.FreeAddr(t)
	setup(t, map[string]string{"ADMIN_TOKEN": tok, "ADMIN_ADDR": adminAddr})
	resp, body = send(t, http.MethodGet, "http://"+adminAddr+"/metrics", nil, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "the private listener's /metrics needs no token: %s", body)
	require.Contains(t, string(body), "outbox_backlog_scrape_success")
}

// A short ADMIN_TOKEN is accepted, with a warning, only while the admin
// surface listens on loopback alone.
func TestShortAdminTokenOnLoopbackWarns(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"ADMIN_TOKEN": "a"})
	require.Contains(t, s.logs.String(), "ADMIN_TOKEN is shorter than 32 characters")
	resp, _ := send(t, http.MethodGet, s.url+"/outbox/stats", map[string]string{"Authorization": "Bearer a"}, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// Admin input that is not text (a NUL byte, invalid UTF-8) is the caller's
// error, answered 422 with the field named, never the server's 500; nothing
// is written.
func TestAdminInputThatIsNotTextIsRefused(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	tok := strings.Repeat("k", 32)
	s := setup(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": tok, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	auth := map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
	resp, body := send(t, http.MethodPost, s.url+"/webhook-endpoints", auth,
		`{"url":"http://127.0.0.1:9/hook","event_types":["order.placed\u0000"]}`)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, "event_types must be UTF-8 text without NUL bytes")
	for _, q := range []string{"type=%ff", "ordering_key=%00", "type=a%00b"} {
		resp, body = send(t, http.MethodGet, s.url+"/outbox/messages?"+q, auth, "")
		requireProblem(t, resp, body, http.StatusUnprocessableEntity, "must be UTF-8 text without NUL bytes")
	}
	resp, body = send(t, http.MethodGet, s.url+"/webhook-endpoints", auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `[]`, string(body), "no endpoint was written")
}

// An admin resource has one address: the spellings of its id other than
// the canonical one (urn:uuid:…, braces, no dashes), which uuid.Parse would
// read, are not found.
func TestAdminIDsHaveOneSpelling(t *testing.T) {
	t.Parallel()
	tok := strings.Repeat("k", 32)
	s := setup(t, map[string]string{"DATABASE_URL": dbtest.URL(t), "ADMIN_TOKEN": tok, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	auth := map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
	resp, body := send(t, http.MethodPost, s.url+"/webhook-endpoints", auth, `{"url":"http://127.0.0.1:9/hook","event_types":["order.placed"]}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	var ep struct{ ID string }
	require.NoError(t, json.Unmarshal(body, &ep))
	resp, _ = send(t, http.MethodGet, s.url+"/webhook-endpoints/"+strings.ToUpper(ep.ID), auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "the canonical spelling, in any case")
	for _, id := range []string{"urn:uuid:" + ep.ID, "%7B" + ep.ID + "%7D", strings.ReplaceAll(ep.ID, "-", "")} {
		resp, body = send(t, http.MethodGet, s.url+"/webhook-endpoints/"+id, auth, "")
		requireProblem(t, resp, body, http.StatusNotFound, "no such id")
	}
}

// Rotating a secret without a body keeps the previous one for the default
// overlap (24 h), whether the empty body came with Content-Length: 0 or
// chunked; a body that is there must be valid.
func TestRotateSecretWithoutABodyUsesTheDefaultOverlap(t *testing.T) {
	t.Parallel()
	tok := strings.Repeat("k", 32)
	s := setup(t, map[string]string{"DATABASE_URL": dbtest.URL(t), "ADMIN_TOKEN": tok, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	auth := map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
	var ep struct{ ID, Secret string }
	rotate := func(chunked bool) {
		t.Helper()
		// An endpoint each: a second rotation during the first's overlap
		// is refused.
		created, body := send(t, http.MethodPost, s.url+"/webhook-endpoints", auth, `{"url":"http://127.0.0.1:9/hook","event_types":["order.placed"]}`)
		require.Equal(t, http.StatusCreated, created.StatusCode, "%s", body)
		require.NoError(t, json.Unmarshal(body, &ep))
		req, err := http.NewRequest(http.MethodPost, s.url+"/webhook-endpoints/"+ep.ID+"/rotate-secret", http.NoBody)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		if chunked {
			req.ContentLength, req.TransferEncoding = -1, []string{"chunked"}
		}
		start := time.Now()
		resp, err := contracttest.Client(t, nil).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "chunked %v: %s", chunked, b)
		var rotated struct {
			Secret                  string
			PreviousSecretExpiresAt time.Time `json:"previous_secret_expires_at"`
		}
		require.NoError(t, json.Unmarshal(b, &rotated))
		require.NotEqual(t, ep.Secret, rotated.Secret, "a new secret")
		require.WithinDuration(t, start.Add(24*time.Hour), rotated.PreviousSecretExpiresAt, time.Minute, "the default overlap")
	}
	rotate(false)
	rotate(true)
	resp, body := send(t, http.MethodPost, s.url+"/webhook-endpoints/"+ep.ID+"/rotate-secret", auth, `{"overlap":"1h"`)
	requireProblem(t, resp, body, http.StatusBadRequest, "")
}

// A refused input's problem detail is its reason in the caller's terms,
// field first, and nothing more: not the chain of packages and actions
// that wrapped it on its way out, which is for a log. The production
// guard refuses the URLs.
func TestAdminRefusalsSayWhyInTheCallersTerms(t *testing.T) {
	t.Parallel()
	tok := strings.Repeat("k", 32)
	s := setup(t, map[string]string{"DATABASE_URL": dbtest.URL(t), "ADMIN_TOKEN": tok})
	auth := map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
	resp, body := send(t, http.MethodPost, s.url+"/webhook-endpoints", auth, `{"kind":"nats","subject":"orders.events","event_types":["order.placed"]}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	type endpoint struct {
		ID, URL    string
		EventTypes []string `json:"event_types"`
	}
	var ep endpoint
	require.NoError(t, json.Unmarshal(body, &ep))

	for _, tc := range []struct{ method, path, body, detail string }{
		{http.MethodPost, "/webhook-endpoints", `{"url":"ftp://1.1.1.1/hooks","event_types":["order.placed"]}`,
			`url: scheme "ftp" is not http or https`},
		{http.MethodPost, "/webhook-endpoints", `{"url":"http://[::1","event_types":["order.placed"]}`,
			`url: missing ']' in host`},
		{http.MethodPost, "/webhook-endpoints", `{"url":"http://169.254.169.254/latest/meta-data/","event_types":["order.placed"]}`,
			`url: 169.254.169.254 is the cloud metadata service, which webhooks may not reach`},
		{http.MethodPost, "/webhook-endpoints", `{"kind":"nats","subject":"orders.*","event_types":["order.placed"]}`,
			`NATS subject "orders.*" has a wildcard; publish to one subject`},
		{http.MethodPost, "/webhook-endpoints", `{"kind":"nats","url":"https://1.1.1.1/","event_types":["order.placed"]}`,
			`url does not apply to a nats destination (it takes subject)`},
		{http.MethodPatch, "/webhook-endpoints/" + ep.ID, `{"url":"https://user:pw@1.1.1.1/"}`,
			`url: userinfo is not allowed`},
		{http.MethodPatch, "/webhook-endpoints/" + ep.ID, `{"event_types":[]}`,
			`event_types must name at least one event type`},
		{http.MethodPost, "/webhook-endpoints/" + ep.ID + "/replay", `{"from":"2026-01-02T00:00:00Z","to":"2026-01-01T00:00:00Z"}`,
			`from must be before to`},
		{http.MethodGet, "/outbox/messages?status=lost", ``,
			`status must be one of pending, claimed, delivered, failed, discarded, not "lost"`},
	} {
		resp, body := send(t, tc.method, s.url+tc.path, auth, tc.body)
		requireProblem(t, resp, body, http.StatusUnprocessableEntity, tc.detail)
		var p struct{ Detail string }
		require.NoError(t, json.Unmarshal(body, &p))
		require.Equal(t, tc.detail, p.Detail, "%s %s: the reason, and only the reason", tc.method, tc.path)
	}
	resp, body = send(t, http.MethodGet, s.url+"/webhook-endpoints/"+ep.ID, auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var after endpoint
	require.NoError(t, json.Unmarshal(body, &after))
	require.Equal(t, ep, after, "the refused changes changed nothing")
	resp, body = send(t, http.MethodGet, s.url+"/webhook-endpoints", auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var all []endpoint
	require.NoError(t, json.Unmarshal(body, &all))
	require.Len(t, all, 1, "the refused creations wrote nothing")
}
