package apiserver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/proctest"

	"github.com/outboxkit/orders/internal/dbtest"
)

// upstream is the traceparent of a caller that traces: the api continues its
// trace when tracing is on, and ignores it when off.
const (
	upstreamTrace = "0af7651916cd43dd8448eb211c80319c"
	upstream      = "00-" + upstreamTrace + "-b7ad6b7169203331-01"
)

// placeTraced registers an endpoint, places an order with the upstream
// traceparent and returns the trace_context stored with its event.
func placeTraced(t *testing.T, s *server, dbURL string) *string {
	t.Helper()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) }))
	t.Cleanup(hook.Close)
	status, body := s.do(t, http.MethodPost, "/webhook-endpoints", "Bearer "+adminToken,
		fmt.Sprintf(`{"url":%q,"event_types":["order.placed"]}`, hook.URL))
	require.Equal(t, http.StatusCreated, status, "%s", body)

	req, err := http.NewRequest(http.MethodPost, s.url+"/orders",
		strings.NewReader(`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":100}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", upstream)
	resp, err := contracttest.Client(t, &http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var stored *string
	require.NoError(t, conn.QueryRow(ctx, `SELECT trace_context::text FROM outbox_events`).Scan(&stored))
	return stored
}

// TestTracingIsOffWithoutAnExporter: with no OTEL variables the api installs
// nothing: a caller's traceparent is not picked up and messages carry no
// trace context.
func TestTracingIsOffWithoutAnExporter(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	s := setup(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	require.Nil(t, placeTraced(t, s, dbURL))
	require.NoError(t, s.stop())
	require.NotContains(t, s.logs.String(), "tracing on")
}

// TestTracingWithTheConsoleExporter: OTEL_TRACES_EXPORTER=console turns
// tracing on at the edge: the request continues the caller's trace, the
// order's message stores it, and the spans are written to stdout.
func TestTracingWithTheConsoleExporter(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	s := setup(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
		"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "orders-api-test"})
	stored := placeTraced(t, s, dbURL)
	require.NotNil(t, stored)
	require.Contains(t, *stored, upstreamTrace, "the message carries the request's trace")
	require.NoError(t, s.stop())
	logs := s.logs.String()
	require.Contains(t, logs, "tracing on")
	require.Contains(t, logs, upstreamTrace, "the request span was exported on shutdown")
	require.Contains(t, logs, "orders-api-test")
}

func TestTracingConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"OTEL_TRACES_EXPORTER":        "jaeger",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
	} {
		env := map[string]string{"DATABASE_URL": closedDB, "API_ADDR": "127.0.0.1:0", name: value}
		err := apiserver.Run(context.Background(), nil, proctest.Environ(env), &proctest.Output{})
		require.ErrorContains(t, err, "invalid configuration")
		require.ErrorContains(t, err, name)
	}
}
