-- +goose Up

-- The trace context of the request that enqueued the message (OpenTelemetry
-- propagation fields, such as {"traceparent": "00-…", "tracestate": "…"}), so
-- the relay continues that trace when it delivers and sends the W3C headers
-- with the webhook: one trace spans request, commit and delivery. NULL when
-- the message was written outside a traced request, which is always the case
-- with tracing off. Adding a nullable column without a default rewrites
-- nothing and takes only a brief lock.
ALTER TABLE outbox_messages ADD COLUMN trace_context jsonb;

-- +goose Down
ALTER TABLE outbox_messages DROP COLUMN trace_context;
