package orders_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/telemetry"
)

// The propagator a traced process installs at its edge (telemetry.Setup).
// Tests here have no span unless they make one, so it changes nothing else.
func init() {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}

// hookRecorder is a webhook receiver that keeps the headers of each request.
type hookRecorder struct {
	srv     *httptest.Server
	mu      sync.Mutex
	headers map[string]http.Header // webhook-id → headers of its last delivery
}

func newHookRecorder(t *testing.T) *hookRecorder {
	h := &hookRecorder{headers: map[string]http.Header{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.headers[r.Header.Get("webhook-id")] = r.Header.Clone()
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookRecorder) get(id string) (http.Header, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.headers[id]
	return v, ok
}

// TestTraceSpansRequestCommitAndDelivery places an order through a traced
// api (the handler as apiserver wraps it when tracing is on) and lets a real,
// traced relay deliver it: the receiver gets a traceparent in the request's
// trace, and the delivery span is recorded in that trace, a child of the
// request's span, linked to River's span for the deliver job. An order placed
// outside any trace is delivered with no traceparent at all.
func TestTraceSpansRequestCommitAndDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	pool := dbtest.Pool(t)
	logger := slog.New(slog.DiscardHandler)
	guard := netguard.Guard{AllowPrivate: true}
	hooks := newHookRecorder(t)
	_, err := admin.New(pool, guard, logger).CreateEndpoint(ctx, hooks.srv.URL+"/hook", []string{orders.EventPlaced})
	require.NoError(t, err)

	svc := orders.NewService(pool, logger)
	mux := http.NewServeMux()
	mux.Handle("/orders", svc.Handler())
	mux.Handle("/orders/", svc.Handler())
	api := httptest.NewServer((&telemetry.Tracing{Provider: tp}).Handler(mux))
	t.Cleanup(api.Close)

	// A traced request, and an order placed with no span at all.
	res, err := api.Client().Post(api.URL+"/orders", "application/json", strings.NewReader(validBody))
	require.NoError(t, err)
	var traced orders.Order
	require.NoError(t, json.NewDecoder(res.Body).Decode(&traced))
	res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	untraced, _, err := svc.Place(ctx, orders.PlaceRequest{CustomerID: "c-2", Lines: validLines})
	require.NoError(t, err)

	var server sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			server = s
		}
	}
	require.NotNil(t, server, "the api request was traced")
	traceID := server.SpanContext().TraceID()

	// The trace context is stored with the event, in the order's transaction;
	// the receiver sees the event id as webhook-id.
	eventID := func(orderID string) (id string, stored *string) {
		require.NoError(t, pool.QueryRow(ctx,
			`SELECT m.event_id::text, ev.trace_context::text FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id
			WHERE ev.payload->>'id' = $1`, orderID).Scan(&id, &stored))
		return id, stored
	}
	tracedMsg, stored := eventID(traced.ID.String())
	require.NotNil(t, stored)
	require.Contains(t, *stored, traceID.String())
	untracedMsg, none := eventID(untraced.ID.String())
	require.Nil(t, none, "no span, no trace context")

	relay, err := relay.New(pool, relay.Config{PollInterval: 50 * time.Millisecond, TracerProvider: tp},
		&relay.HTTPTransport{Client: guard.Client()}, logger, nil)
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = relay.Stop(stop)
	})

	var tracedH, untracedH http.Header
	require.Eventually(t, func() bool {
		var ok1, ok2 bool
		tracedH, ok1 = hooks.get(tracedMsg)
		untracedH, ok2 = hooks.get(untracedMsg)
		return ok1 && ok2
	}, 15*time.Second, 20*time.Millisecond)

	require.Empty(t, untracedH.Get("traceparent"), "an order placed outside a trace is sent without one")
	require.Empty(t, untracedH.Get("tracestate"))

	tp2 := tracedH.Get("traceparent")
	require.NotEmpty(t, tp2, "the receiver gets the trace context")
	sent := propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(tracedH))
	sentSC := trace.SpanContextFromContext(sent)
	require.True(t, sentSC.IsValid(), "traceparent %q", tp2)
	require.Equal(t, traceID, sentSC.TraceID(), "the webhook continues the request's trace")

	// The delivery span: in the request's trace, the request span its parent,
	// and the one the receiver's traceparent names.
	var deliver, job sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		deliver, job = nil, nil
		for _, s := range rec.Ended() {
			switch {
			case s.Name() == "outbox.deliver" && s.SpanContext().TraceID() == traceID:
				deliver = s
			case s.Name() == "river.work/outbox_deliver" && job == nil:
				job = s
			}
		}
		return deliver != nil && job != nil
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, server.SpanContext().SpanID(), deliver.Parent().SpanID())
	require.Equal(t, deliver.SpanContext().SpanID(), sentSC.SpanID())
	require.Equal(t, trace.SpanKindClient, deliver.SpanKind())
	attrs := map[string]string{}
	for _, a := range deliver.Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	require.Equal(t, tracedMsg, attrs["outbox.event_id"])
	require.NotEmpty(t, attrs["outbox.message_id"])
	require.Equal(t, "delivered", attrs["outbox.outcome"])
	require.Equal(t, "204", attrs["http.response.status_code"])
	require.NotEmpty(t, deliver.Links(), "the delivery links to River's span for its job")

	t.Logf("request span %s → delivery span %s (trace %s); receiver got traceparent %s",
		server.Name(), deliver.Name(), traceID, tp2)
}
