package process_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/process"
)

// Requests are counted by the pattern that matched, the innermost one when
// muxes nest, never by the raw path: a thousand order ids are one series.
func TestHTTPMetricsByRoutePattern(t *testing.T) {
	t.Parallel()
	inner := http.NewServeMux()
	inner.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	inner.HandleFunc("POST /orders/{id}/cancel", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusConflict)
	})
	outer := http.NewServeMux()
	outer.Handle("/orders/", inner)
	m := process.NewHTTPMetrics()
	reg := prometheus.NewRegistry()
	for _, c := range m.Collectors() {
		require.NoError(t, reg.Register(c))
	}
	srv := httptest.NewServer(m.Wrap(outer))
	t.Cleanup(srv.Close)
	do := func(method, path string) {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	for i := range 5 {
		do(http.MethodGet, "/orders/"+strings.Repeat("x", i+1))
	}
	do(http.MethodPost, "/orders/1/cancel")
	do(http.MethodGet, "/nowhere")
	do("BREW", "/orders/1")

	want := `
# HELP http_requests_total Requests answered, by route pattern (unmatched: no route), method and status code.
# TYPE http_requests_total counter
http_requests_total{code="200",method="GET",route="GET /orders/{id}"} 5
http_requests_total{code="404",method="GET",route="unmatched"} 1
http_requests_total{code="405",method="other",route="unmatched"} 1
http_requests_total{code="409",method="POST",route="POST /orders/{id}/cancel"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "http_requests_total"))
	require.Equal(t, 4, testutil.CollectAndCount(m.Collectors()[1]), "one duration series per route and method")
}

// The pool's connections and waits come from its own counters.
func TestPoolCollector(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	c := process.NewPoolCollector(pool, "api")
	want := `
# HELP pgxpool_connections Connections by state: acquired (in use), idle, constructing.
# TYPE pgxpool_connections gauge
pgxpool_connections{pool="api",state="acquired"} 1
pgxpool_connections{pool="api",state="constructing"} 0
pgxpool_connections{pool="api",state="idle"} 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "pgxpool_connections"))
	conn.Release()
	require.Equal(t, 8, testutil.CollectAndCount(c))
}
