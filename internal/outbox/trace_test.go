package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/outbox"
)

// The propagator a traced process installs at its edge (telemetry.Setup).
// Other tests here enqueue with no span, so it changes nothing for them.
func init() {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
}

// TestRelayPassesTheStoredTraceContextOnWithTracingOff: a message enqueued
// in a traced request is delivered with that request's traceparent and
// tracestate even by a relay that traces nothing itself (no tracer provider),
// so the receiver joins the request's trace; a message enqueued without a
// span is delivered without them.
func TestRelayPassesTheStoredTraceContextOnWithTracingOff(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")

	state, err := trace.ParseTraceState("vendor=abc")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	var traced []string
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		id, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: map[string]any{"n": 1}})
		traced = append(traced, id.String())
		return err
	}))
	untraced := f.enqueue(t, "order.placed", map[string]any{"n": 2})

	f.startRelay(t, fastConfig(), nil)
	within(t, 10*time.Second, func() bool { return rc.total() == 2 }, "both messages delivered")

	rc.mu.Lock()
	h, plain := rc.headers[traced[0]], rc.headers[f.event(t, untraced[0]).String()]
	rc.mu.Unlock()
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", h.Get("traceparent"))
	require.Equal(t, "vendor=abc", h.Get("tracestate"))
	require.Empty(t, h.Get("baggage"), "only the W3C trace context goes to receivers")
	require.Empty(t, plain.Get("traceparent"), "no span at enqueue, no traceparent")
	require.Empty(t, plain.Get("tracestate"))
	require.Zero(t, rc.badSigned, "the trace headers leave the signature intact")
}
