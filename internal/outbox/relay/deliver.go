package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/webhook"
)

// deliverArgs is one deliver job: a turn at serving one destination.
type deliverArgs struct {
	Destination uuid.UUID `json:"destination"`
}

// Kind implements river.JobArgs.
func (deliverArgs) Kind() string { return "outbox_deliver" }

// InsertOpts implements river.JobArgsWithInsertOpts. River retries a job
// only when it failed to reach the database; a retry takes the lease again,
// or finds it held and does nothing.
func (deliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: queueDeliver, MaxAttempts: 3}
}

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

// Tuning of a deliver job that is not worth a setting.
const (
	// deliverSlice is how long one job serves its destination before making
	// way: it queues the next job for it behind those already waiting, so
	// when destinations outnumber workers each gets its turn.
	deliverSlice = 5 * time.Second
	// idlePolls is how many polls in a row may find nothing due before the
	// job ends: a destination with steady traffic keeps its job, an idle
	// one frees the worker within a fraction of a second.
	idlePolls = 4
	// flushSize is how many outcomes are recorded in one statement at most;
	// fewer are recorded at every poll interval, so none waits longer.
	flushSize = 64
	// settleTimeout bounds a job's final writes, which run even after its
	// context was cancelled.
	settleTimeout = 10 * time.Second
)

// jobTimeout is how long a deliver job may run: its slice, a last request,
// and its final writes.
func (c Config) jobTimeout() time.Duration {
	return deliverSlice + c.DeliveryTimeout + settleTimeout + 5*time.Second
}

type deliverWorker struct {
	river.WorkerDefaults[deliverArgs]
	relay *Relay
}

func (w *deliverWorker) Timeout(*river.Job[deliverArgs]) time.Duration {
	return w.relay.cfg.jobTimeout()
}

func (w *deliverWorker) Work(ctx context.Context, job *river.Job[deliverArgs]) error {
	r := w.relay
	dest := job.Args.Destination
	q := outboxdb.New(r.pool)
	if r.draining() {
		// Stopping: hand the destination back to the other relays now rather
		// than after the redispatch delay.
		if err := q.DestinationUndispatch(ctx, dest); err != nil {
			return fmt.Errorf("handing back destination: %w", err)
		}
		return nil
	}
	token := uuid.New()
	lease, err := q.DestinationLease(ctx, token, r.id, dest)
	if errors.Is(err, pgx.ErrNoRows) {
		// Served by a live job already, paused, backing off or deleted.
		return nil
	}
	if err != nil {
		// The lease may be taken all the same (committed, the answer lost):
		// held by this live relay, it would keep every other job away.
		release := func(ctx context.Context) error { return outboxdb.New(r.pool).DestinationLeaseRelease(ctx, dest, token) }
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		if release(rctx) != nil {
			r.deferSettle(release)
		}
		return fmt.Errorf("leasing destination: %w", err)
	}
	r.metrics.deliverJobs.Inc()
	s := &session{
		r: r, job: job, dest: dest, token: token, ep: lease,
		health: lease.Health, failures: int(lease.ConsecutiveFailures),
		probing:  lease.Health == outbox.HealthBackingOff,
		results:  make(chan sent, r.cfg.DestinationConcurrency),
		woken:    make(chan struct{}, 1),
		recorded: make(chan recordResult, 1),
	}
	defer r.serving(dest, s.woken)()
	return s.run(ctx)
}

// session is one deliver job's turn at its destination.
type session struct {
	r     *Relay
	job   *river.Job[deliverArgs]
	dest  uuid.UUID
	token uuid.UUID
	ep    outboxdb.DestinationLeaseRow

	// The destination's health as stored (health), and as this job sees it.
	health      string
	failures    int    // endpoint-wide failures in a row
	lastFailure string // the latest of them
	// probing: the destination was backing off, so one message at a time
	// is sent until one gets an answer; probeFailed: one did not.
	probing, probeFailed bool
	// retryAfter is when the receiver asked the whole destination to wait
	// until (429 or 503 with Retry-After); gone that it answered 410.
	retryAfter time.Time
	gone       bool

	results  chan sent
	woken    chan struct{} // a commit for the destination (listen.go)
	inFlight int
	outcomes []outcome // not yet recorded
	// recording: a flush is in flight, its outcomes out of s.outcomes;
	// recorded reports its end. Recording runs beside the claims and the
	// requests, so a destination's throughput is not the sum of its
	// statements' latencies.
	recording bool
	recorded  chan recordResult
	// recordWarned is when a failed recording was last said: while the
	// database is away a flush fails at every poll.
	recordWarned time.Time
	// claimedBeside: a claim ran while the recording in flight did, so it
	// may have parked a message behind one the recording settled, unseen
	// by the recording's promotion (MessagesPromoteKeys).
	claimedBeside bool
	unsent        []uuid.UUID // claimed, never sent: released without an attempt
	// claimFailed: a claim statement failed, and may have committed rows
	// the job never saw; the settle releases them too.
	claimFailed bool
	// opened caches the endpoint's secrets decrypted, by stored value.
	opened map[string]string
}

// recordResult is the end of one flush.
type recordResult struct {
	outcomes []outcome
	err      error
}

// sent is one request's end.
type sent struct {
	row      outboxdb.MessageClaimRow
	res      Result
	span     trace.Span
	started  time.Time
	finished time.Time
	// notSent: the job was cancelled before the request began.
	notSent bool
	// interrupted: the job was cancelled while the request was in flight.
	interrupted bool
}

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
	// What the answer says about the destination as a whole.
	endpointFailure bool
	retryAfter      time.Duration
	gone            bool
}

// stopClaiming reports whether the session must claim nothing more.
func (s *session) stopClaiming() bool {
	switch {
	case s.gone, !s.retryAfter.IsZero():
		return true
	case s.probing:
		return s.probeFailed
	default:
		return s.failures >= s.r.cfg.CircuitThreshold
	}
}

// slots is how many requests may be in flight: one while probing.
func (s *session) slots() int {
	if s.probing {
		return 1
	}
	return min(s.r.cfg.DestinationConcurrency, s.r.cfg.BatchSize)
}

// room is how many messages may be claimed now.
func (s *session) room() int { return s.slots() - s.inFlight }

func (s *session) run(ctx context.Context) error {
	r := s.r
	// Requests run on their own context: a hard stop cancels them, and
	// their outcomes are still recorded on the job's.
	sendCtx, cancelSends := context.WithCancel(ctx)
	defer cancelSends()
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	sliceEnds := time.Now().Add(deliverSlice)

	var (
		stopping   bool // the relay is stopping or the slice is over
		cancelled  bool // the job's context is done: cancel what is in flight
		dueLeft    = true
		idle       int
		lastClaim  time.Time
		claimFails int
		// Closed channels fire at every select: each is waited on once.
		drain, done = r.drain, ctx.Done()
	)
	for {
		if !stopping && (r.draining() || time.Now().After(sliceEnds)) {
			stopping = true
		}
		if !stopping && !cancelled && dueLeft && !s.stopClaiming() {
			room := s.room()
			// Claim when every slot is free, or a poll interval has passed
			// since the last claim: a fast receiver's slots come back
			// together and are refilled by one full claim (a claim costs
			// about as much for one message as for thirty), a slow or
			// uneven one's within a poll interval.
			if room > 0 && (s.inFlight == 0 || room == s.slots() || time.Since(lastClaim) >= r.cfg.PollInterval) {
				s.claimedBeside = s.claimedBeside || s.recording
				rows, err := s.claim(ctx, room)
				lastClaim = time.Now()
				switch {
				case err != nil:
					// Try again at the next poll; after three failures in a
					// row, leave the destination to the next job.
					claimFails++
					s.claimFailed = true
					dueLeft = false
					if claimFails >= 3 && ctx.Err() == nil {
						r.logger.WarnContext(ctx, "claiming messages", slog.String("destination", s.dest.String()), slog.Any("error", err))
						stopping = true
					}
				case len(rows) < room:
					dueLeft = false // nothing more is due now; look again at the next poll
					claimFails = 0
				default:
					claimFails = 0
				}
				if len(rows) > 0 {
					idle = 0
				}
				for _, row := range rows {
					s.inFlight++
					// A broker destination signs nothing: its secret is
					// never opened, so one that does not decrypt holds
					// nothing up. The destination is checked again: a row
					// stored before a rule (controlSurface) is not sent.
					dest, err := destination.Parse(row.EndpointUrl)
					sign := signing{}
					switch {
					case err != nil:
						sign.err = fmt.Errorf("not sent: %w", err)
					case dest.Kind == destination.KindWebhook:
						sign = s.signing(row)
					}
					go s.send(sendCtx, row, dest, sign)
				}
			}
		}
		if s.inFlight == 0 && !s.recording && (stopping || cancelled || s.stopClaiming() || idle >= idlePolls) {
			break
		}
		select {
		case res := <-s.results:
			s.handle(ctx, res)
			// Take every other result already waiting before deciding
			// whether to claim: fewer, fuller claims.
			for more := true; more; {
				select {
				case res := <-s.results:
					s.handle(ctx, res)
				default:
					more = false
				}
			}
			if len(s.outcomes) >= flushSize {
				s.flush(ctx)
			}
		case res := <-s.recorded:
			s.record(ctx, res)
			// After a failure the next try waits for the poll: a database
			// that is away would be retried in a tight loop.
			if res.err == nil && len(s.outcomes) >= flushSize {
				s.flush(ctx)
			}
		case <-poll.C:
			s.flush(ctx)
			if !dueLeft && s.inFlight == 0 {
				idle++
			}
			dueLeft = true
		case <-s.woken:
			// A commit for this destination (OUTBOX_NOTIFY): look now
			// rather than at the next poll.
			dueLeft, lastClaim = true, time.Time{}
		case <-drain:
			drain, stopping = nil, true
		case <-done:
			done, cancelled = nil, true
			cancelSends()
		}
	}
	return s.settle(ctx)
}

// claim claims up to n of the destination's due messages, in one round
// trip and under a generic plan: planning the claim at every call cost as
// much as running it, and a destination's claims follow one another, so
// that time bounded its rate (see MessageClaim).
func (s *session) claim(ctx context.Context, n int) ([]outboxdb.MessageClaimRow, error) {
	rows, err := claimMessages(ctx, s.r.pool, outboxdb.MessageClaimParams{
		ClaimToken: s.token, RelayID: s.r.id, Destination: s.dest, BatchSize: int32(n),
	})
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	if len(rows) > 0 {
		s.r.metrics.claimed.Add(float64(len(rows)))
		// progressAt measures idleness on this process's clock;
		// claimedAt is written to the database (on its clock, by the
		// heartbeat).
		s.r.progressAt.Store(time.Now().UnixNano())
		s.r.claimedAt.Store(s.r.now().UnixNano())
	}
	return rows, nil
}

// claimMessages runs MessageClaim on db (the pool, or a transaction whose
// later statements then run under generic plans too) with
// TransactionPlanGeneric before it, in one round trip.
func claimMessages(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, p outboxdb.MessageClaimParams) ([]outboxdb.MessageClaimRow, error) {
	var rows []outboxdb.MessageClaimRow
	b := &pgx.Batch{}
	outboxdb.QueueTransactionPlanGeneric(b)
	outboxdb.QueueMessageClaim(b, p, &rows)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rows, nil
}

// send makes one request and reports its end on s.results.
func (s *session) send(ctx context.Context, row outboxdb.MessageClaimRow, dest destination.Destination, sign signing) {
	r := s.r
	if ctx.Err() != nil {
		s.results <- sent{row: row, notSent: true}
		return
	}
	started := r.now()
	spanCtx, span, header := r.startDeliverSpan(ctx, s.dest, row)
	body := webhook.Body(row.EventID, row.Type, row.CreatedAt, row.Payload)
	reqCtx, cancel := context.WithTimeout(spanCtx, r.cfg.DeliveryTimeout)
	res := Result{Err: sign.err}
	if res.Err == nil {
		res = r.transport.Deliver(reqCtx, Delivery{
			EventID: row.EventID, MessageID: row.ID, Type: row.Type, URL: row.EndpointUrl, Destination: dest, Secret: sign.secret,
			PreviousSecret: sign.previous, Body: body, Header: header,
			Data: row.Payload, CreatedAt: row.CreatedAt, OrderingKey: orEmpty(row.OrderingKey),
		})
	}
	cancel()
	s.results <- sent{row: row, res: res, span: span, started: started, finished: r.now(),
		interrupted: res.Err != nil && ctx.Err() != nil}
}

// handle takes one request's end into the session: its outcome to record,
// and what it says about the destination's health.
func (s *session) handle(ctx context.Context, res sent) {
	s.inFlight--
	if res.notSent {
		s.unsent = append(s.unsent, res.row.ID)
		return
	}
	o := s.r.judge(res)
	endDeliverSpan(res.span, res.res, o)
	s.outcomes = append(s.outcomes, o)
	switch {
	case res.interrupted:
		// Says nothing about the destination, whatever its label: at the
		// cap it is "failed", and taking that for an answer would close a
		// circuit no receiver answered.
	case res.res.Err != nil && res.res.MessageFault:
		// Neither: the client may have refused the message without
		// reaching the broker (nats.go checks the server's max_payload it
		// remembers, even while reconnecting), so it is no sign that the
		// destination is up, nor down.
	case o.gone:
		s.gone = true
	case o.endpointFailure:
		s.failures++
		s.lastFailure = o.err
		if s.probing {
			s.probeFailed = true
		}
		if o.retryAfter > 0 {
			s.retryAfter = maxTime(s.retryAfter, s.r.dbTime(o.finished).Add(o.retryAfter))
		}
	default:
		// The receiver answered (it may still have refused this message):
		// the destination is reachable.
		s.failures = 0
		if s.probing {
			s.recovered(ctx)
		}
	}
}

// recovered marks a destination that was backing off healthy again, at
// once, so the ops page and the other relays see it while this job goes on,
// and makes due the retries the outage pushed back (MessagesBringForward). If
// that write fails, the settle stores the health and says it; the retries
// then keep their schedule.
func (s *session) recovered(ctx context.Context) {
	r := s.r
	s.probing = false
	// Bounded: the session's loop waits on it, and holds the lease meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var forward int64
	err := inTx(ctx, r.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		var err error
		if forward, err = q.MessagesBringForward(ctx, s.dest, s.token); err != nil {
			return fmt.Errorf("bringing retries forward: %w", err)
		}
		return q.DestinationHealthy(ctx, s.dest, s.token)
	})
	if err != nil {
		r.logger.WarnContext(ctx, "recording destination recovered", slog.String("destination", s.dest.String()), slog.Any("error", err))
		return
	}
	s.announceRecovered(ctx, slog.Int64("retries_brought_forward", forward))
}

// announceRecovered logs and counts a destination's recovery, once.
func (s *session) announceRecovered(ctx context.Context, attrs ...any) {
	s.health = outbox.HealthHealthy
	s.r.metrics.stateChanges.WithLabelValues(outbox.HealthHealthy).Inc()
	attrs = append([]any{slog.String("destination", s.dest.String()), slog.String("url", s.ep.Url)}, attrs...)
	if s.ep.HealthChangedAt != nil {
		attrs = append(attrs, slog.Duration("backed_off_for", s.r.dbNow().Sub(*s.ep.HealthChangedAt).Round(time.Second)))
	}
	s.r.logger.InfoContext(ctx, "destination recovered", attrs...)
}

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
)

// judge turns a request's end into the message's next state.
func (r *Relay) judge(s sent) outcome {
	res := s.res
	attempt := int(s.row.Attempts) + 1
	code := res.StatusCode
	o := outcome{id: s.row.ID, attempt: attempt, code: code, started: s.started, finished: s.finished}
	if s.row.OrderingKey != nil {
		o.key = *s.row.OrderingKey
	}
	switch {
	case res.Err == nil && (res.Acked || code >= 200 && code < 300):
		o.status, o.label = outbox.StatusDelivered, labelDelivered
		return o
	case s.interrupted:
		// Cut off by a stop: it may have reached the receiver, so it is an
		// attempt, but it says nothing of the receiver and is due again now.
		o.status, o.label = outbox.StatusPending, labelInterrupted
		o.err = "interrupted: the relay stopped during the request"
		if attempt >= r.cfg.MaxAttempts {
			// At the cap it fails, as a dead relay's claims do
			// (MessagesReleaseLost): a message whose request stops its relay
			// every time cannot keep stopping relays. Its attempt is the
			// failed one, as every attempt that reaches the cap is.
			o.status, o.label = outbox.StatusFailed, labelFailed
			o.err = r.lastAttempt(attempt) + ": " + o.err
		}
		return o
	case code == http.StatusGone:
		// The receiver says it is gone: the endpoint is paused, and this
		// message waits with the others until a person enables it again.
		o.status, o.label, o.gone = outbox.StatusPending, labelGone, true
		o.err = "410 Gone: endpoint paused"
		return o
	case errors.Is(res.Err, context.DeadlineExceeded):
		o.err = fmt.Sprintf("no answer within the delivery timeout (%s)", r.cfg.DeliveryTimeout)
	case res.Err != nil:
		o.err = res.Err.Error()
	default:
		o.err = strconv.Itoa(code) + " " + http.StatusText(code)
		if res.Detail != "" {
			o.err += ": " + res.Detail
		}
	}
	o.endpointFailure = res.Err != nil && !res.MessageFault || endpointWide(code)
	if (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) && res.RetryAfter > 0 {
		o.retryAfter = min(res.RetryAfter, 24*time.Hour)
	}
	if attempt >= r.cfg.MaxAttempts {
		o.status, o.label = outbox.StatusFailed, labelFailed
		o.err = r.lastAttempt(attempt) + ": " + o.err
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
	o.delay = max(r.cfg.retryDelay(attempt), o.retryAfter)
	return o
}

// lastAttempt names a message's last attempt. One can be past the cap: a
// 410 Gone on the last attempt pauses the endpoint and leaves the message
// waiting, to be tried once more when the endpoint is enabled again, and
// the cap may have been lowered since the message's earlier attempts.
func (r *Relay) lastAttempt(attempt int) string {
	if attempt > r.cfg.MaxAttempts {
		return fmt.Sprintf("attempt %d, past the cap of %d", attempt, r.cfg.MaxAttempts)
	}
	return fmt.Sprintf("attempt %d of %d", attempt, r.cfg.MaxAttempts)
}

// endpointWide reports whether an answer is the destination's trouble
// rather than this message's: it is overloaded or down (408, 429, 5xx), or
// it is set up wrong (401 and 403: it does not verify our signature, as
// after a botched secret rotation; 404 and 405: the URL names no webhook
// route). Each says the same of every message, so five in a row back the
// destination off as a whole, its messages wait without spending attempts,
// and the first answer after the fix brings everything back. Any other
// answer (400, 422, 413, …) is about this message alone.
func endpointWide(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests,
		http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return code >= 500
}

// flush starts recording the outcomes gathered so far, unless a recording
// is already in flight: one at a time, so outcomes are recorded in the
// order they came. Its end arrives on s.recorded.
func (s *session) flush(ctx context.Context) {
	// A cancelled job records what it has at its settle, on a context of
	// its own: a flush on ctx would fail at once, and flushing again would
	// keep the job from ever ending.
	if len(s.outcomes) == 0 || s.recording || ctx.Err() != nil {
		return
	}
	batch := s.outcomes
	s.outcomes = nil
	s.recording = true
	s.claimedBeside = false
	params := s.recordParams(batch)
	go func() {
		_, err := outboxdb.New(s.r.pool).MessagesRecordOutcomes(ctx, params)
		s.recorded <- recordResult{outcomes: batch, err: err}
	}()
}

// record takes a flush's end: a failure puts its outcomes back, first, for
// the next flush or the settle.
func (s *session) record(ctx context.Context, res recordResult) {
	s.recording = false
	if res.err != nil {
		if ctx.Err() == nil && time.Since(s.recordWarned) > 30*time.Second {
			s.recordWarned = time.Now()
			s.r.logger.WarnContext(ctx, "recording delivery outcomes", slog.String("destination", s.dest.String()), slog.Any("error", res.err))
		}
		s.outcomes = append(res.outcomes, s.outcomes...)
		return
	}
	if s.claimedBeside {
		s.promoteKeys(ctx, res.outcomes)
	}
	s.counted(ctx, res.outcomes)
}

// promoteKeys lets go the messages a claim parked, beside the recording of
// outcomes, behind the keyed ones it settled (see MessagesPromoteKeys).
// Failing, it leaves them to the job's end, which promotes every stranded
// message of the destination.
func (s *session) promoteKeys(ctx context.Context, outcomes []outcome) {
	var keys []string
	for _, o := range outcomes {
		// Only a delivery lets its key go on: a retry or a failure holds it.
		if o.key != "" && o.status == outbox.StatusDelivered {
			keys = append(keys, o.key)
		}
	}
	if len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	if _, err := outboxdb.New(s.r.pool).MessagesPromoteKeys(ctx, keys, s.dest); err != nil && ctx.Err() == nil {
		s.r.logger.WarnContext(ctx, "promoting parked messages", slog.String("destination", s.dest.String()), slog.Any("error", err))
	}
}

func (s *session) recordParams(outcomes []outcome) outboxdb.MessagesRecordOutcomesParams {
	p := outboxdb.MessagesRecordOutcomesParams{ClaimToken: s.token}
	for _, o := range outcomes {
		p.Ids = append(p.Ids, o.id)
		p.Statuses = append(p.Statuses, o.status)
		p.DelaysSeconds = append(p.DelaysSeconds, o.delay.Seconds())
		p.LastErrors = append(p.LastErrors, truncate(o.err, 500))
		p.Attempts = append(p.Attempts, int32(o.attempt))
		p.Outcomes = append(p.Outcomes, o.label)
		p.StartedAts = append(p.StartedAts, s.r.dbTime(o.started))
		p.FinishedAts = append(p.FinishedAts, s.r.dbTime(o.finished))
		p.StatusCodes = append(p.StatusCodes, int32(o.code))
	}
	return p
}

// counted updates the metrics and logs for recorded outcomes.
func (s *session) counted(ctx context.Context, outcomes []outcome) {
	r := s.r
	endpoint := s.dest.String()
	for _, o := range outcomes {
		r.metrics.deliveries.WithLabelValues(o.label).Inc()
		if r.metrics.byEndpoint != nil {
			r.metrics.byEndpoint.WithLabelValues(endpoint, o.label).Inc()
		}
		if elapsed := o.finished.Sub(o.started); elapsed > 0 {
			r.metrics.deliveryDuration.WithLabelValues(o.label).Observe(elapsed.Seconds())
			if r.metrics.byEndpointDuration != nil {
				r.metrics.byEndpointDuration.WithLabelValues(endpoint, o.label).Observe(elapsed.Seconds())
			}
		}
		if o.status == outbox.StatusFailed {
			r.logger.WarnContext(ctx, "message failed", slog.String("message_id", o.id.String()),
				slog.String("destination", s.dest.String()), slog.String("error", o.err))
		}
	}
	if r.metrics.byEndpoint != nil && len(outcomes) > 0 {
		r.metrics.sawEndpoint(s.dest)
	}
}

// settle ends the job: in one transaction it records the last outcomes,
// releases what was claimed and never sent, promotes messages parked behind
// one that settled unseen (MessagesPromoteStranded, once a while:
// strandedSweepDue), stores the destination's health
// and frees its lease, queues the next job when due work remains, and
// completes this River job. It runs even when the job's context was
// cancelled. If the database cannot be reached, the relay retries the same
// writes at its next heartbeats.
func (s *session) settle(ctx context.Context) error {
	r := s.r
	ctx = context.WithoutCancel(ctx)
	health, backoffUntil, reason := s.verdict()
	write := func(ctx context.Context, tx pgx.Tx) error {
		return s.settleWrite(ctx, tx, health, backoffUntil, reason)
	}
	settleCtx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	err := inTx(settleCtx, r.pool, func(tx pgx.Tx) error {
		if err := write(settleCtx, tx); err != nil {
			return err
		}
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](settleCtx, tx, s.job); err != nil {
			return fmt.Errorf("completing deliver job: %w", err)
		}
		return nil
	})
	if err != nil {
		// Retried by the heartbeat loop until it succeeds; the River job is
		// left to River's retry, which finds the lease and does nothing.
		r.deferSettle(func(ctx context.Context) error {
			if err := inTx(ctx, r.pool, func(tx pgx.Tx) error { return write(ctx, tx) }); err != nil {
				return err
			}
			// Counted and said once recorded, as on time.
			s.counted(ctx, s.outcomes)
			s.announce(ctx, health, backoffUntil)
			return nil
		})
		return fmt.Errorf("settling deliver job for %s: %w", s.dest, err)
	}
	s.counted(ctx, s.outcomes)
	s.announce(ctx, health, backoffUntil)
	return nil
}

// strandedSweepEvery is how often, at most, the deliver jobs of one
// process sweep a destination's stranded messages as they end.
const strandedSweepEvery = 10 * time.Second

// strandedSweepDue says whether a deliver job of dest ending now sweeps
// its stranded messages (MessagesPromoteStranded), and if so counts it as
// done. The sweep reads every parked message of the destination, and a
// job ends after idlePolls polls with nothing due: when messages come due
// in a trickle (retries in an outage that holds thousands of keys behind
// their heads), a sweep at every end could be most of the database's
// work. What it catches is rare (a claim racing a person's
// skip or a released claim), so a stranded message waits at most this
// interval and a job's end; the prune job sweeps every destination too.
func (r *Relay) strandedSweepDue(dest uuid.UUID) bool {
	now := r.now()
	r.sweepMu.Lock()
	defer r.sweepMu.Unlock()
	if at, ok := r.sweptAt[dest]; ok && now.Sub(at) < strandedSweepEvery {
		return false
	}
	if len(r.sweptAt) > 1000 {
		// Forget destinations not swept lately (deleted ones, say).
		for d, at := range r.sweptAt {
			if now.Sub(at) >= strandedSweepEvery {
				delete(r.sweptAt, d)
			}
		}
	}
	r.sweptAt[dest] = now
	return true
}

// settleWrite is the settle's writes but the River job's completion: the
// last outcomes recorded, the unsent released, the stranded promoted, the
// destination's health stored and its lease freed, and the next deliver
// job queued when due work remains.
func (s *session) settleWrite(ctx context.Context, tx pgx.Tx, health string, backoffUntil *time.Time, reason *string) error {
	q := outboxdb.New(tx)
	if len(s.outcomes) > 0 {
		if _, err := q.MessagesRecordOutcomes(ctx, s.recordParams(s.outcomes)); err != nil {
			return fmt.Errorf("recording delivery outcomes: %w", err)
		}
	}
	if len(s.unsent) > 0 {
		if _, err := q.MessagesRelease(ctx, s.unsent, s.token); err != nil {
			return fmt.Errorf("releasing unsent messages: %w", err)
		}
	}
	if s.claimFailed {
		if _, err := q.MessagesReleaseByToken(ctx, s.token); err != nil {
			return fmt.Errorf("releasing messages of failed claims: %w", err)
		}
	}
	if s.r.strandedSweepDue(s.dest) {
		if _, err := q.MessagesPromoteStranded(ctx, s.dest); err != nil {
			return fmt.Errorf("promoting stranded messages: %w", err)
		}
	}
	redispatch, err := q.DestinationSettle(ctx, outboxdb.DestinationSettleParams{
		ID: s.dest, LeaseToken: s.token, Health: health, HealthReason: reason,
		ConsecutiveFailures: int32(s.failures), BackoffUntil: backoffUntil, Gone: s.gone,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// The lease is no longer ours (this relay was declared dead,
		// or the endpoint deleted): whoever holds it now decides.
		return nil
	}
	if err != nil {
		return fmt.Errorf("settling destination: %w", err)
	}
	if redispatch {
		if _, err := s.r.client.InsertTx(ctx, tx, deliverArgs{Destination: s.dest}, nil); err != nil {
			return fmt.Errorf("queueing the next deliver job: %w", err)
		}
	}
	return nil
}

// verdict is the destination's health as the job leaves it: backing off
// when endpoint-wide failures reached the threshold (then backoffUntil is
// the next probe), else healthy (then backoffUntil is the end of a
// Retry-After, if the receiver sent one).
func (s *session) verdict() (health string, backoffUntil *time.Time, reason *string) {
	cfg := s.r.cfg
	if s.failures >= cfg.CircuitThreshold {
		if s.probing && !s.probeFailed {
			// No probe was made (nothing was due): nothing has changed.
			return outbox.HealthBackingOff, s.ep.BackoffUntil, s.ep.HealthReason
		}
		if !s.probing {
			// It starts backing off now. The streak is stored as the
			// threshold, so each failed probe after this adds one and
			// doubles the wait before the next.
			s.failures = cfg.CircuitThreshold
		}
		until := s.r.dbNow().Add(cfg.probeDelay(s.failures - cfg.CircuitThreshold))
		until = maxTime(until, s.retryAfter)
		why := truncate(s.lastFailure, 500)
		return outbox.HealthBackingOff, &until, &why
	}
	if !s.retryAfter.IsZero() {
		return outbox.HealthHealthy, &s.retryAfter, nil
	}
	return outbox.HealthHealthy, nil, nil
}

// announce logs and counts the destination's state changes as the job
// leaves it, once each: starting to back off, recovering (when recovered
// could not record it), being paused by a 410.
func (s *session) announce(ctx context.Context, health string, backoffUntil *time.Time) {
	r := s.r
	dest := slog.String("destination", s.dest.String())
	switch {
	case health == outbox.HealthBackingOff && s.health != outbox.HealthBackingOff:
		r.metrics.stateChanges.WithLabelValues(outbox.HealthBackingOff).Inc()
		r.logger.WarnContext(ctx, "destination failing: backing off as a whole", dest, slog.String("url", s.ep.Url),
			slog.String("error", s.lastFailure), slog.Int("consecutive_failures", s.failures),
			slog.Time("next_probe_at", *backoffUntil))
	case health == outbox.HealthHealthy && s.health == outbox.HealthBackingOff:
		s.announceRecovered(ctx)
	}
	if s.gone {
		r.metrics.stateChanges.WithLabelValues(outbox.HealthPaused).Inc()
		r.logger.WarnContext(ctx, "destination paused: the receiver answered 410 Gone; its messages wait until it is enabled again",
			dest, slog.String("url", s.ep.Url))
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
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
