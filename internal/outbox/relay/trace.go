package relay

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/google/uuid"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Tracing across the outbox (OpenTelemetry). Enqueue stores the propagation
// fields of the caller's span with each message; the relay continues that
// trace with an "outbox.deliver" span per message and sends the W3C headers
// (traceparent, tracestate) with the webhook, so one trace spans the request,
// its commit and every delivery attempt, however much later it happens.
//
// Nothing here reads the environment or installs a provider: a process that
// wants traces installs a tracer provider and propagator at its edge (see
// internal/telemetry). Without one the tracer is a no-op, no span is ever
// valid in a request's context, and Enqueue stores nothing.

// instrumentationName names this package's tracer.
const instrumentationName = "github.com/outboxkit/orders/internal/outbox/relay"

// w3c is what goes out with a webhook: the W3C Trace Context headers only.
// Webhook receivers are other parties; other propagation fields the process
// may carry internally (baggage) stay inside.
var w3c propagation.TraceContext

// tracer returns the relay's tracer: from the configured provider, or a no-op.
func (c Config) tracer() trace.Tracer {
	tp := c.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(instrumentationName)
}

// startDeliverSpan starts the span of one delivery attempt. Its parent is the
// trace the message was enqueued in, when it carries one, linked to the
// deliver job's own span (River's, when its middleware traces jobs); a message
// enqueued outside a trace gets a span under the job's. The returned header
// holds the W3C fields to send, only for a message that carries a trace
// context: a message enqueued outside any trace is sent exactly as before.
func (r *Relay) startDeliverSpan(ctx context.Context, destination uuid.UUID, row outboxdb.MessageClaimRow) (context.Context, trace.Span, http.Header) {
	attrs := trace.WithAttributes(
		attribute.String("outbox.message_id", row.ID.String()),
		attribute.String("outbox.event_id", row.EventID.String()),
		attribute.String("outbox.event_type", row.Type),
		attribute.String("outbox.destination", destination.String()),
		attribute.Int("outbox.attempt", int(row.Attempts)+1),
	)
	origin := remoteContext(ctx, row.TraceContext)
	if origin == nil {
		ctx, span := r.tracer.Start(ctx, "outbox.deliver", trace.WithSpanKind(trace.SpanKindClient), attrs)
		return ctx, span, nil
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), attrs}
	if job := trace.SpanContextFromContext(ctx); job.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: job}))
	}
	spanCtx, span := r.tracer.Start(origin, "outbox.deliver", opts...)
	// A no-op tracer (tracing off in this process) still passes the stored
	// context on, so the receiver joins the request's trace.
	from := spanCtx
	if !span.SpanContext().IsValid() {
		from = origin
	}
	header := http.Header{}
	w3c.Inject(from, propagation.HeaderCarrier(header))
	if len(header) == 0 {
		header = nil
	}
	// Keep the job's context (deadline, cancellation, River's client) and
	// put the delivery span in it.
	return trace.ContextWithSpan(ctx, span), span, header
}

// remoteContext returns ctx carrying the span context stored with a message,
// or nil when it carries none that parses.
func remoteContext(ctx context.Context, stored []byte) context.Context {
	if len(stored) == 0 {
		return nil
	}
	var carrier propagation.MapCarrier
	if err := json.Unmarshal(stored, &carrier); err != nil || len(carrier) == 0 {
		return nil
	}
	// The process's propagator reads what it wrote; W3C is the fallback for
	// a process that has none installed (the worker with tracing off).
	origin := otel.GetTextMapPropagator().Extract(ctx, carrier)
	if !trace.SpanContextFromContext(origin).IsValid() {
		origin = w3c.Extract(ctx, carrier)
	}
	if !trace.SpanContextFromContext(origin).IsValid() {
		return nil
	}
	// Extract put the stored span context in place of the job's span: it is
	// the parent of the delivery.
	return origin
}

// endDeliverSpan records a delivery's outcome on its span and ends it.
func endDeliverSpan(span trace.Span, res Result, o outcome) {
	if !span.IsRecording() {
		span.End()
		return
	}
	if res.StatusCode != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", res.StatusCode))
	}
	span.SetAttributes(attribute.String("outbox.outcome", o.label))
	if o.status != outbox.StatusDelivered {
		if res.Err != nil {
			span.RecordError(res.Err)
		}
		span.SetStatus(codes.Error, truncate(o.err, 200))
	}
	span.End()
}
