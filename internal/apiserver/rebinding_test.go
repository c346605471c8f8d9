package apiserver_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
)

// DNS rebinding: a page of attacker.example whose name the attacker then
// points at the api's address is, to the browser, same-origin with the
// api: its requests pass the cross-origin check and carry whatever the
// page knows (cmd/dev's admin token is in the README). Only their Host
// tells them apart. Every route of every listener, read from the muxes'
// registrations, answers 421 to such a request and writes nothing; the
// same requests by the listener's address or localhost still work, as
// cmd/dev is used.
func TestRebindingRequestsAreMisdirected(t *testing.T) {
	t.Parallel()
	routes := registeredRoutes(t)
	for _, want := range []string{"POST /webhook-endpoints", "GET /outbox/messages", "POST /orders", "POST /ops/login", "GET /metrics"} {
		require.Contains(t, routes, want, "the routes are read from the muxes' registrations")
	}
	for _, split := range []bool{false, true} {
		t.Run(map[bool]string{false: "one listener", true: "with ADMIN_ADDR"}[split], func(t *testing.T) {
			t.Parallel()
			dbURL := dbtest.URL(t)
			tok := strings.Repeat("k", 32)
			env := map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": tok, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"}
			if split {
				env["ADMIN_ADDR"] = proctest.FreeAddr(t)
			}
			s := setup(t, env)
			listeners := []string{strings.TrimPrefix(s.url, "http://")}
			if split {
				listeners = append(listeners, env["ADMIN_ADDR"])
			}
			conn, err := pgx.Connect(context.Background(), dbURL)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			ids := rebindingScene(t, s.url, listeners[len(listeners)-1], tok, conn)

			before := snapshot(t, conn)
			for _, addr := range listeners {
				_, port, err := net.SplitHostPort(addr)
				require.NoError(t, err)
				attacker := "attacker.example:" + port
				for _, route := range routes {
					method, path := routeRequest(route, ids)
					t.Run(addr+" "+route, func(t *testing.T) {
						resp, body := send(t, method, "http://"+addr+path, map[string]string{
							"Host": attacker, "Origin": "http://" + attacker, "Sec-Fetch-Site": "same-origin",
							"Sec-Fetch-Mode": "cors", "Authorization": "Bearer " + tok, "Content-Type": "application/json",
						}, routeBody(route))
						requireProblem(t, resp, body, http.StatusMisdirectedRequest, `"attacker.example"`)
						require.Empty(t, resp.Cookies(), "a refused request starts no session")
					})
				}
			}
			require.Equal(t, before, snapshot(t, conn), "the rebound requests wrote nothing")

			// The same request by the listener's address or by localhost,
			// as cmd/dev is used, is answered.
			admin := listeners[len(listeners)-1]
			_, port, err := net.SplitHostPort(admin)
			require.NoError(t, err)
			for _, host := range []string{admin, "localhost:" + port} {
				resp, body := send(t, http.MethodPost, "http://"+admin+"/webhook-endpoints", map[string]string{
					"Host": host, "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin",
					"Authorization": "Bearer " + tok, "Content-Type": "application/json",
				}, routeBody("POST /webhook-endpoints"))
				require.Equal(t, http.StatusCreated, resp.StatusCode, "Host %s: %s", host, body)
			}
		})
	}
}

// A name given in API_ALLOWED_HOSTS is answered; others still are not.
func TestAllowedHostsAreAnswered(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"API_ALLOWED_HOSTS": "api.example.test"})
	_, port, err := net.SplitHostPort(strings.TrimPrefix(s.url, "http://"))
	require.NoError(t, err)
	resp, body := send(t, http.MethodGet, s.url+"/healthz", map[string]string{"Host": "API.example.test:" + port}, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	resp, body = send(t, http.MethodGet, s.url+"/healthz", map[string]string{"Host": "other.example.test:" + port}, "")
	requireProblem(t, resp, body, http.StatusMisdirectedRequest, "API_ALLOWED_HOSTS")
}

// rebindingIDs are ids of rows the routes' {id} stands for, so that a
// request that got through would change something.
type rebindingIDs struct{ endpoint, message, order string }

// rebindingScene places an order, with an endpoint subscribed to it whose
// message failed (retry and skip act on failed messages), and returns their
// ids.
func rebindingScene(t *testing.T, public, admin, tok string, conn *pgx.Conn) rebindingIDs {
	t.Helper()
	auth := map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
	resp, body := send(t, http.MethodPost, "http://"+admin+"/webhook-endpoints", auth, routeBody("POST /webhook-endpoints"))
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	resp, body = send(t, http.MethodPost, public+"/orders", map[string]string{"Content-Type": "application/json"}, orderBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	var ids rebindingIDs
	require.NoError(t, conn.QueryRow(context.Background(), `UPDATE outbox_messages
		SET status = 'failed', attempts = 1, failed_at = now(), next_attempt_at = now()
		RETURNING id::text, destination::text, (SELECT id::text FROM orders)`).Scan(&ids.message, &ids.endpoint, &ids.order))
	return ids
}

// snapshot is the state a request could change: every row of the tables
// the routes write, as text.
func snapshot(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var parts []string
	for _, table := range []string{"orders", "outbox_events", "outbox_messages", "webhook_endpoints", "ops_sessions"} {
		var rows string
		require.NoError(t, conn.QueryRow(context.Background(),
			`SELECT count(*) || ':' || COALESCE(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM `+table+` t`).Scan(&rows))
		parts = append(parts, table+"="+rows)
	}
	return strings.Join(parts, " ")
}

// routeRequest is the method and path of a request to a registered pattern,
// its wildcards filled with the scene's ids.
func routeRequest(pattern string, ids rebindingIDs) (method, path string) {
	method, path, found := strings.Cut(pattern, " ")
	if !found {
		method, path = http.MethodGet, pattern
	}
	id := ids.order
	switch {
	case strings.Contains(path, "endpoints"):
		id = ids.endpoint
	case strings.Contains(path, "messages"):
		id = ids.message
	}
	path = strings.ReplaceAll(path, "{id}", id)
	path = strings.ReplaceAll(path, "{$}", "")
	return method, path
}

// routeBody is a valid body for the route, so that only the Host check can
// be what refuses it.
func routeBody(pattern string) string {
	switch {
	case pattern == "POST /orders":
		return orderBody
	case pattern == "POST /webhook-endpoints", strings.HasPrefix(pattern, "PATCH "):
		return `{"url":"http://127.0.0.1:9/rebound","event_types":["order.placed"]}`
	case strings.HasSuffix(pattern, "/replay"):
		return `{"from":"2000-01-01T00:00:00Z","to":"2100-01-01T00:00:00Z"}`
	}
	return `{}`
}
