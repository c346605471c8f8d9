package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/orders/internal/webhook"
)

// HTTPTransport delivers webhooks over HTTP in the Standard Webhooks format:
// webhook-id (the event id, the receiver's dedup key), webhook-timestamp
// and webhook-signature headers over the JSON body.
type HTTPTransport struct {
	// Client sends the requests. Use netguard.Guard.Client so the SSRF guard
	// holds at connect time and redirects are not followed.
	Client *http.Client
	// Now stamps webhook-timestamp; nil means time.Now.
	Now func() time.Time
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
	req.Header.Set("User-Agent", "outboxkit-relay/1")

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
