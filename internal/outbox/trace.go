package outbox

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing across the outbox (OpenTelemetry). Enqueue stores the propagation
// fields of the caller's span with each message; the relay (package relay) continues that
// trace with an "outbox.deliver" span per message and sends the W3C headers
// (traceparent, tracestate) with the webhook, so one trace spans the request,
// its commit and every delivery attempt, however much later it happens.
//
// Nothing here reads the environment or installs a provider: a process that
// wants traces installs a tracer provider and propagator at its edge (see
// internal/telemetry). Without one the tracer is a no-op, no span is ever
// valid in a request's context, and Enqueue stores nothing.

// traceContext returns the propagation fields of the span in ctx as a JSON
// object, using the process's propagator, or nil when ctx holds no valid
// span. On the write path with tracing off this is one context lookup and a
// comparison: no allocation, no encoding.
func traceContext(ctx context.Context) []byte {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil // no propagator installed: nothing to carry
	}
	b, err := json.Marshal(carrier)
	if err != nil {
		return nil // a map of strings always encodes; tracing never fails an order
	}
	return b
}
