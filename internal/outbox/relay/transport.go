package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/webhook"
)

// Delivery is one webhook request to make.
type Delivery struct {
	// EventID is the webhook-id: the receiver's dedup key, the same for
	// every delivery of the event. MessageID is this delivery's own row.
	EventID   uuid.UUID
	MessageID uuid.UUID
	Type      string
	URL       string
	// Destination is URL read: its kind and, for a broker, the names to
	// publish to. The relay sets it; a zero one is read from URL.
	Destination destination.Destination
	Secret      string
	// PreviousSecret, set during a secret rotation's overlap, adds a second
	// signature so receivers still on the old secret verify too.
	PreviousSecret string
	// Body is the Standard Webhooks body: the message envelope and its data.
	Body []byte
	// Data is the event's payload alone, CreatedAt its time and OrderingKey
	// its key (empty when unkeyed): what a broker message carries, with the
	// envelope in headers.
	Data        json.RawMessage
	CreatedAt   time.Time
	OrderingKey string
	// Header holds extra headers to send: the W3C trace context (traceparent,
	// tracestate) of a message enqueued in a traced request; nil otherwise.
	// They never replace the webhook-* headers.
	Header http.Header
}

// Result is what a receiver answered.
type Result struct {
	// StatusCode is the HTTP status, or 0 when no answer came (Err is set)
	// or the destination is a broker.
	StatusCode int
	// Acked says a broker acknowledged the message: it is stored (a
	// JetStream ack, a Kafka acks=all produce, a RabbitMQ publisher confirm).
	Acked bool
	// RetryAfter is the receiver's Retry-After, if it sent one.
	RetryAfter time.Duration
	// Err is a transport failure: refused, timed out, reset, forbidden.
	Err error
	// MessageFault says Err is about this message alone (a broker, or the
	// client before it, refuses it as too large), as a 4xx answer other
	// than the endpoint-wide ones is: it is retried and fails on its own,
	// and the destination is not backed off for it, its other messages
	// going on; nor is it taken for a sign the destination is up.
	MessageFault bool
	// Detail is a short excerpt of a failed answer's body, for the row.
	Detail string
}

// Transport sends one webhook. The relay's contract with it: Deliver returns
// only after the request has finished or failed, and never retries itself.
type Transport interface {
	Deliver(ctx context.Context, d Delivery) Result
}

// HTTPTransport delivers webhooks over HTTP in the Standard Webhooks format:
// webhook-id (the event id, the receiver's dedup key), webhook-timestamp
// and webhook-signature headers over the JSON body.
type HTTPTransport struct {
	// Client sends the requests. Use netguard.Guard.Client so the SSRF guard
	// holds at connect time and redirects are not followed.
	Client *http.Client
	// Now stamps webhook-timestamp; nil means time.Now.
	Now func() time.Time
	// UserAgent names the sender to receivers and their logs: the worker
	// sets its service's name (process.UserAgent), so a service made from
	// this template never calls itself by the template's. Empty leaves Go's
	// default.
	UserAgent string
}

// maxErrorBody bounds how much of a failed answer is read: enough for an
// error message on the row, and draining lets the connection be reused.
const maxErrorBody = 4 << 10

// Deliver implements Transport.
func (t *HTTPTransport) Deliver(ctx context.Context, d Delivery) Result {
	signer, err := webhook.NewSigner(d.Secret)
	if err != nil {
		return Result{Err: fmt.Errorf("reading endpoint secret: %w", err)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		return Result{Err: fmt.Errorf("building request: %w", err)}
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	for k, v := range d.Header {
		req.Header[k] = v
	}
	ts := now()
	signer.SetHeaders(req.Header, d.EventID.String(), ts, d.Body)
	if d.PreviousSecret != "" {
		// During a rotation's overlap: one signature per secret, space-separated.
		if key, err := webhook.ParseSecret(d.PreviousSecret); err == nil {
			req.Header.Set(webhook.HeaderSignature, req.Header.Get(webhook.HeaderSignature)+" "+
				webhook.Sign(key, d.EventID.String(), ts, d.Body))
		}
	}
	if t.UserAgent != "" {
		req.Header.Set("User-Agent", t.UserAgent)
	}

	resp, err := t.Client.Do(req)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	res := Result{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), now())}
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		res.Detail = strings.TrimSpace(truncate(string(excerpt), 200))
	}
	return res
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or bad.
// A delay longer than a year is read as a year: the relay waits a day at
// most (judge), and seconds past 292 years would overflow a Duration into
// a short or negative wait.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	const year = 365 * 24 * time.Hour
	secs, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	switch {
	case err == nil:
		return time.Duration(min(secs, uint64(year/time.Second))) * time.Second
	case errors.Is(err, strconv.ErrRange):
		return year // digits only, past what 64 bits hold
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}
