package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/orders/internal/outbox"
)

// What came of a request: the message's next state (judge) and what the
// answer says of the destination as a whole (signalOf), two questions
// answered apart so each has one place.

// Attempt outcomes, as outbox_attempts and the metrics name them.
const (
	labelDelivered   = "delivered"
	labelRetry       = "retry"
	labelFailed      = "failed"
	labelGone        = "gone"
	labelInterrupted = "interrupted"
	// labelRefused is a retry after a refusal of this message alone
	// (Result.MessageFault: too large for the broker): it says nothing of
	// the destination, so a recovery does not bring it forward.
	labelRefused = "refused"
	// labelThrottled is no attempt: a refusal the relay's own concurrency
	// provoked (pace.go). The message goes back to pending as it was; only
	// the metrics count it.
	labelThrottled = "throttled"
)

// outcome is what the relay records for one message and its attempt.
type outcome struct {
	id       uuid.UUID
	key      string // the ordering key, if any
	attempt  int
	status   string
	delay    time.Duration
	err      string
	label    string
	code     int
	started  time.Time
	finished time.Time
	// eventAt is when its event was written (the database's clock): the
	// delivery's lag is measured from it. kind is its destination's.
	eventAt time.Time
	kind    string
}

// judge turns one request's end into the message's next state: delivered;
// due again at once (410, cut off by a stop); retried after its schedule's
// wait, or a Retry-After if longer; failed at the attempt cap. attempts is
// the message's count before this attempt.
func (c Config) judge(id uuid.UUID, key string, attempts int, res Result, interrupted bool, started, finished time.Time) outcome {
	attempt := attempts + 1
	code := res.StatusCode
	o := outcome{id: id, key: key, attempt: attempt, code: code, started: started, finished: finished}
	switch {
	case res.Err == nil && (res.Acked || code >= 200 && code < 300):
		o.status, o.label = outbox.StatusDelivered, labelDelivered
		return o
	case interrupted:
		// Cut off by a stop: it may have reached the receiver, so it is an
		// attempt, but it says nothing of the receiver and is due again now.
		o.status, o.label = outbox.StatusPending, labelInterrupted
		o.err = "interrupted: the relay stopped during the request"
		if attempt >= c.MaxAttempts {
			// At the cap it fails, as a lost claim does (MessagesReleaseLost):
			// a message whose request stops its relay every time cannot keep
			// stopping relays. Its attempt is the failed one, as every attempt
			// that reaches the cap is.
			o.status, o.label = outbox.StatusFailed, labelFailed
			o.err = c.lastAttempt(attempt) + ": " + o.err
		}
		return o
	case code == http.StatusGone:
		// The receiver says it is gone: the endpoint is paused, and this
		// message waits with the others until a person enables it again.
		o.status, o.label = outbox.StatusPending, labelGone
		o.err = "410 Gone: endpoint paused"
		return o
	case errors.Is(res.Err, context.DeadlineExceeded):
		o.err = fmt.Sprintf("no answer within the delivery timeout (%s)", c.DeliveryTimeout)
	case res.Err != nil:
		o.err = res.Err.Error()
	default:
		o.err = strconv.Itoa(code) + " " + http.StatusText(code)
		if res.Detail != "" {
			o.err += ": " + res.Detail
		}
	}
	if attempt >= c.MaxAttempts {
		o.status, o.label = outbox.StatusFailed, labelFailed
		o.err = c.lastAttempt(attempt) + ": " + o.err
		return o
	}
	o.status, o.label = outbox.StatusPending, labelRetry
	if res.MessageFault {
		o.label = labelRefused
	}
	// Retry-After holds the whole destination back (backoff_until); this
	// message waits at least that, and never less than its own schedule: a
	// receiver answering Retry-After: 1 through an outage would otherwise
	// spend its attempts a second apart.
	o.delay = max(c.retryDelay(attempt), retryAfter(res))
	return o
}

// retryAfter is how long a 429 or 503 asked to wait, a day at most.
func retryAfter(res Result) time.Duration {
	if res.StatusCode != http.StatusTooManyRequests && res.StatusCode != http.StatusServiceUnavailable {
		return 0
	}
	return min(res.RetryAfter, 24*time.Hour)
}

// lastAttempt names a message's last attempt. One can be past the cap: a
// 410 Gone on the last attempt pauses the endpoint and leaves the message
// waiting, to be tried once more when the endpoint is enabled again, and
// the cap may have been lowered since the message's earlier attempts.
func (c Config) lastAttempt(attempt int) string {
	if attempt > c.MaxAttempts {
		return fmt.Sprintf("attempt %d, past the cap of %d", attempt, c.MaxAttempts)
	}
	return fmt.Sprintf("attempt %d of %d", attempt, c.MaxAttempts)
}

// signalOf says what a request's end says of its destination as a whole
// (pace.go). interrupted: the relay cut it off.
func signalOf(res Result, interrupted bool) signal {
	code := res.StatusCode
	switch {
	case res.Err == nil && (res.Acked || code >= 200 && code < 300):
		return signalUp
	case interrupted:
		// Says nothing about the destination, whatever its outcome: at the
		// cap it is "failed", and taking that for an answer would close a
		// circuit no receiver answered.
		return signalNone
	case res.Err != nil && res.MessageFault:
		// Neither up nor down: the client may have refused the message
		// without reaching the broker (nats.go checks the server's
		// max_payload it remembers, even while reconnecting).
		return signalNone
	case errors.Is(res.Err, context.DeadlineExceeded):
		return signalSlow
	case res.Err != nil:
		return signalRefused
	case code == http.StatusGone:
		return signalGone
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if res.RetryAfter > 0 {
			return signalWait
		}
		return signalFull
	case endpointWide(code):
		return signalDown
	}
	// The receiver answered, refusing this message alone: it is reachable.
	return signalUp
}

// endpointWide reports whether an answer is the destination's trouble
// rather than this message's: it is overloaded or down (408, 429, 5xx), or
// it is set up wrong (401 and 403: it does not verify our signature, as
// after a botched secret rotation; 404 and 405: the URL names no webhook
// route). Each says the same of every message, so five in a row back the
// destination off as a whole, its messages wait without spending attempts,
// and the first answer after the fix brings everything back. Any other
// answer (400, 422, 413, …) is about this message alone. The statement
// that brings retries forward after an outage (MessagesBringForward)
// repeats this list.
func endpointWide(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests,
		http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return code >= 500
}

// truncate makes s text PostgreSQL stores, whatever a receiver answered
// (valid UTF-8 without NUL bytes: either in a statement's parameters makes
// the whole statement fail, and with it every outcome recorded beside it),
// and shortens it to at most n bytes and an ellipsis, cut between
// characters.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
