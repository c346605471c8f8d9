package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// DeliverArgs is one deliver job: messages for one endpoint, claimed together
// under one claim token.
type DeliverArgs struct {
	ClaimToken  uuid.UUID   `json:"claim_token"`
	Destination uuid.UUID   `json:"destination"`
	MessageIDs  []uuid.UUID `json:"message_ids"`
}

// Kind implements river.JobArgs.
func (DeliverArgs) Kind() string { return "outbox_deliver" }

// InsertOpts implements river.JobArgsWithInsertOpts. River retries a job only
// when recording its outcome failed (the database was unreachable); the
// outbox's own claim timeout is the backstop after that.
func (DeliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueDeliver, MaxAttempts: 3}
}

// Delivery is one webhook request to make.
type Delivery struct {
	MessageID uuid.UUID
	Type      string
	URL       string
	Secret    string
	// PreviousSecret, set during a secret rotation's overlap, adds a second
	// signature so receivers still on the old secret verify too.
	PreviousSecret string
	// Body is the Standard Webhooks body: the message envelope and its data.
	Body []byte
	// Header holds extra headers to send: the W3C trace context (traceparent,
	// tracestate) of a message enqueued in a traced request; nil otherwise.
	// They never replace the webhook-* headers.
	Header http.Header
}

// Result is what a receiver answered.
type Result struct {
	// StatusCode is the HTTP status, or 0 when no answer came (Err is set).
	StatusCode int
	// RetryAfter is the receiver's Retry-After, if it sent one.
	RetryAfter time.Duration
	// Err is a transport failure: refused, timed out, reset, forbidden.
	Err error
	// Detail is a short excerpt of a failed answer's body, for the row.
	Detail string
}

// Transport sends one webhook. The relay's contract with it: Deliver returns
// only after the request has finished or failed, and never retries itself.
type Transport interface {
	Deliver(ctx context.Context, d Delivery) Result
}

// webhookBody writes the webhook body, {"id","type","created_at","data"},
// by hand: the payload is JSON the database already validated, and
// json.Marshal would parse and compact it again for every message.
func webhookBody(id uuid.UUID, typ string, createdAt time.Time, data json.RawMessage) ([]byte, error) {
	quotedType, err := json.Marshal(typ)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 96+len(typ)+len(data))
	b = append(b, `{"id":"`...)
	b = append(b, id.String()...)
	b = append(b, `","type":`...)
	b = append(b, quotedType...)
	b = append(b, `,"created_at":"`...)
	b = createdAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","data":`...)
	b = append(b, data...)
	b = append(b, '}')
	return b, nil
}

type deliverWorker struct {
	river.WorkerDefaults[DeliverArgs]
	relay *Relay
}

func (w *deliverWorker) Timeout(job *river.Job[DeliverArgs]) time.Duration {
	return w.relay.cfg.deliverJobTimeout(len(job.Args.MessageIDs))
}

// outcome is what the relay records for one message and its attempt.
type outcome struct {
	id       uuid.UUID
	attempt  int
	status   string
	delay    time.Duration
	err      string
	gone     bool // the endpoint answered 410: disable it
	label    string
	code     int
	started  time.Time
	finished time.Time
}

func (w *deliverWorker) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	r := w.relay
	rows, err := outboxdb.New(r.pool).MessagesForDelivery(ctx, job.Args.MessageIDs, job.Args.ClaimToken)
	if err != nil {
		return fmt.Errorf("loading claimed messages: %w", err)
	}
	if len(rows) == 0 {
		// Every row was re-claimed or settled since: a stale job, nothing to do.
		return nil
	}

	outcomes := make([]outcome, len(rows))
	// unreachable short-circuits the rest of the job once the endpoint cannot
	// be reached at all: its messages back off without each waiting out a
	// timeout, and the job frees its worker for healthy endpoints.
	var unreachable atomic.Pointer[string]
	sem := make(chan struct{}, r.cfg.DeliverConcurrency)
	var wg sync.WaitGroup
	for i, row := range rows {
		if reason := r.undeliverable(row); reason != "" {
			now := time.Now()
			outcomes[i] = outcome{id: row.ID, attempt: int(row.Attempts), status: StatusFailed, err: reason,
				label: "undeliverable", started: now, finished: now}
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			start := time.Now()
			if why := unreachable.Load(); why != nil {
				outcomes[i] = r.judge(row, Result{Err: errors.New("skipped: " + *why)}, start, start)
				return
			}
			res := r.send(ctx, row)
			outcomes[i] = r.judge(row, res.Result, start, time.Now())
			endDeliverSpan(res.span, res.Result, outcomes[i])
			if res.Err != nil {
				msg := res.Err.Error()
				unreachable.CompareAndSwap(nil, &msg)
			}
		}()
	}
	wg.Wait()

	if err := r.record(ctx, job, outcomes); err != nil {
		return err
	}
	for _, o := range outcomes {
		r.metrics.deliveries.WithLabelValues(o.label).Inc()
		if elapsed := o.finished.Sub(o.started); elapsed > 0 {
			r.metrics.deliveryDuration.WithLabelValues(o.label).Observe(elapsed.Seconds())
		}
		if o.status == StatusFailed {
			r.logger.WarnContext(ctx, "message failed", slog.String("message_id", o.id.String()),
				slog.String("destination", job.Args.Destination.String()), slog.String("error", o.err))
		}
	}
	return nil
}

// undeliverable names why a message cannot be sent at all, or returns "".
func (r *Relay) undeliverable(row outboxdb.MessagesForDeliveryRow) string {
	switch {
	case row.EndpointUrl == nil:
		return "endpoint deleted"
	case row.EndpointEnabled == nil || !*row.EndpointEnabled:
		return "endpoint disabled"
	}
	return ""
}

// sent is a receiver's answer and the span of the attempt, still open.
type sent struct {
	Result
	span trace.Span
}

func (r *Relay) send(ctx context.Context, row outboxdb.MessagesForDeliveryRow) sent {
	ctx, span, header := r.startDeliverSpan(ctx, row)
	body, err := webhookBody(row.ID, row.Type, row.CreatedAt, row.Payload)
	if err != nil {
		return sent{Result{Err: fmt.Errorf("encoding body: %w", err)}, span}
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DeliveryTimeout)
	defer cancel()
	return sent{r.transport.Deliver(ctx, Delivery{
		MessageID: row.ID, Type: row.Type, URL: *row.EndpointUrl, Secret: *row.EndpointSecret, Body: body,
		PreviousSecret: row.EndpointPreviousSecret,
		Header:         header,
	}), span}
}

// judge turns a receiver's answer into the row's next state.
func (r *Relay) judge(row outboxdb.MessagesForDeliveryRow, res Result, started, finished time.Time) outcome {
	attempts := int(row.Attempts)
	code := res.StatusCode
	o := outcome{id: row.ID, attempt: attempts, code: code, started: started, finished: finished}
	switch {
	case res.Err == nil && code >= 200 && code < 300:
		o.status, o.label = StatusDelivered, "delivered"
		return o
	case code == http.StatusGone:
		o.status, o.label, o.gone = StatusFailed, "gone", true
		o.err = "410 Gone: endpoint disabled"
		return o
	case res.Err != nil:
		o.err = res.Err.Error()
	default:
		o.err = strconv.Itoa(code) + " " + http.StatusText(code)
		if res.Detail != "" {
			o.err += ": " + res.Detail
		}
	}
	if attempts >= r.cfg.MaxAttempts {
		o.status, o.label = StatusFailed, "failed"
		o.err = fmt.Sprintf("attempt %d of %d: %s", attempts, r.cfg.MaxAttempts, o.err)
		return o
	}
	o.status, o.label = StatusPending, "retry"
	o.delay = r.cfg.backoff(attempts)
	if (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) && res.RetryAfter > 0 {
		o.delay = min(res.RetryAfter, 24*time.Hour)
	}
	return o
}

// record writes every outcome and completes the River job in one
// transaction, only where this job's claim token still holds. Sending came
// first: a crash before this commit means the messages are sent again later
// (at-least-once), never that a message is marked without being sent.
func (r *Relay) record(ctx context.Context, job *river.Job[DeliverArgs], outcomes []outcome) error {
	p := outboxdb.MessagesRecordOutcomesParams{ClaimToken: job.Args.ClaimToken}
	var gone []uuid.UUID
	for _, o := range outcomes {
		p.Ids = append(p.Ids, o.id)
		p.Statuses = append(p.Statuses, o.status)
		p.DelaysSeconds = append(p.DelaysSeconds, o.delay.Seconds())
		p.LastErrors = append(p.LastErrors, truncate(o.err, 500))
		p.Attempts = append(p.Attempts, int32(o.attempt))
		p.Outcomes = append(p.Outcomes, o.label)
		p.StartedAts = append(p.StartedAts, o.started)
		p.FinishedAts = append(p.FinishedAts, o.finished)
		p.StatusCodes = append(p.StatusCodes, int32(o.code))
		if o.gone {
			gone = append(gone, job.Args.Destination)
		}
	}
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		if _, err := q.MessagesRecordOutcomes(ctx, p); err != nil {
			return fmt.Errorf("recording delivery outcomes: %w", err)
		}
		if len(gone) > 0 {
			reason := "receiver answered 410 Gone"
			if err := q.EndpointsDisable(ctx, &reason, gone[:1]); err != nil {
				return fmt.Errorf("disabling gone endpoint: %w", err)
			}
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return fmt.Errorf("completing deliver job: %w", err)
		}
		return nil
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
