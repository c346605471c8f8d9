package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/webhook"
)

// The destination session: one deliver job's turn at serving one
// destination. It takes the destination's lease, then loops: it claims
// what is due a little ahead of the room its pace allows (pace.go), sends
// each message as the window frees, judges each answer (outcome.go) and
// hands it to its recorder (record.go), until its slice is over, the relay
// stops, nothing has been due for a while, or the pace says to stop
// sending. Its end (settle) writes what is left, the destination's health
// and pace, and frees the lease, in one transaction, and wakes the
// dispatch when work is left.
//
// So a slow, hanging or failing destination holds at most one River
// worker and its window of requests, never another destination's share,
// and a message's attempts count only requests that were made.

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

// Tuning of a deliver job that is not worth a setting.
const (
	// deliverSlice is how long one job serves its destination before making
	// way: it queues the next job for it behind those already waiting, so
	// when destinations outnumber workers each gets its turn.
	deliverSlice = 5 * time.Second
	// idlePolls is how many polls in a row may find nothing due before the
	// job ends: a destination with steady traffic keeps its job, an idle
	// one frees the worker within a fraction of a second. While other
	// destinations wait for a worker, a job ends as soon as it finds
	// nothing due: its worker is another destination's turn.
	idlePolls = 4
	// flushSize is how many outcomes wait before a write starts (while one
	// is in flight, more gather for the next); fewer are written at every
	// poll interval, so none waits longer. A write costs about as much for
	// one outcome as for dozens.
	flushSize = 128
	// unrecordedMax is how many outcomes may wait to be written, or be
	// in a write, before the job stops claiming: when the database records slower than the
	// receiver answers, the job slows to the recording's pace instead of
	// claiming the whole backlog, with ever larger writes left for its end.
	unrecordedMax = 4 * flushSize
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
	if !r.alive() {
		// Leave it to a relay whose liveness is certain.
		return nil
	}
	token := uuid.New()
	lease, first, err := r.lease(ctx, dest, token)
	if errors.Is(err, pgx.ErrNoRows) {
		// Served by a live job already, paused, backing off or deleted.
		return nil
	}
	if err != nil {
		// The lease and its first claim may be taken all the same
		// (committed, the answer lost): held by this live relay, the lease
		// would keep every other job away, and the claim would wait out
		// the claim timeout.
		release := func(ctx context.Context) error { return r.leaseRelease(ctx, dest, token) }
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		if release(rctx) != nil {
			r.deferSettle(release)
		}
		return fmt.Errorf("leasing destination: %w", err)
	}
	r.metrics.deliverJobs.Inc()
	s := &session{
		r: r, dest: dest, token: token, ep: lease,
		pace:    newPace(r.cfg, lease),
		rec:     newRecorder(r, dest, token),
		results: make(chan sent, r.cfg.DestinationConcurrency),
		woken:   make(chan struct{}, 1),
	}
	defer r.serving(dest, s.woken)()
	return s.run(ctx, first)
}

// firstClaim is how many messages the lease claims with it: two, the
// fewest that tell a destination with one message due (a job of one order
// fanned out to thousands of endpoints) from one with more. Fewer than
// asked means nothing more is due, as for any claim, so such a job sends
// its message and ends without a second claim, which would find nothing
// and cost about what the first did. A probe sends one; the other goes
// back unsent if the probe fails. The session claims the rest, ahead of
// its requests.
const firstClaim = 2

// lease takes the destination's lease and claims its first message, under
// its lock (order.go) and a generic plan, in one round trip (one
// transaction): pgx.ErrNoRows when a live relay's job holds it, or the
// destination may not be served now. The claim runs after the lease in
// the same transaction, so it sees the new token, and claims nothing when
// the lease was not taken.
func (r *Relay) lease(ctx context.Context, dest, token uuid.UUID) (outboxdb.DestinationLeaseRow, []outboxdb.MessageClaimRow, error) {
	var row outboxdb.DestinationLeaseRow
	var rows []outboxdb.MessageClaimRow
	var found bool
	b := &pgx.Batch{}
	outboxdb.QueueDestinationLock(b, dest)
	outboxdb.QueueTransactionPlanGeneric(b)
	outboxdb.QueueDestinationLease(b, token, r.id, dest, &row, &found)
	outboxdb.QueueMessageClaim(b, outboxdb.MessageClaimParams{
		ClaimToken: token, RelayID: r.id, Destination: dest, BatchSize: firstClaim,
	}, &rows)
	if err := r.pool.SendBatch(ctx, b).Close(); err != nil {
		return row, nil, err
	}
	if !found {
		return row, nil, pgx.ErrNoRows
	}
	r.claimed(len(rows))
	return row, rows, nil
}

// leaseRelease gives up a lease whose taking failed as far as the job
// could tell, with what its first claim may have claimed: back to pending,
// no attempt counted (MessagesReleaseByToken), keys promoted.
func (r *Relay) leaseRelease(ctx context.Context, dest, token uuid.UUID) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		if err := q.DestinationLock(ctx, dest); err != nil {
			return fmt.Errorf("locking destination: %w", err)
		}
		keys, err := q.MessagesReleaseByToken(ctx, token)
		if err != nil {
			return fmt.Errorf("releasing the first claim: %w", err)
		}
		if err := promote(ctx, q, dest, keys); err != nil {
			return err
		}
		if err := q.DestinationLeaseRelease(ctx, dest, token); err != nil {
			return fmt.Errorf("releasing lease: %w", err)
		}
		return nil
	})
}

// mode is where a session is in its turn.
type mode int

const (
	// serving: claiming what is due, as the pace allows.
	serving mode = iota
	// draining: the slice is over or the relay is stopping: nothing more is
	// claimed, the requests in flight finish.
	draining
	// cancelled: the job's context is done, or the relay's liveness lapsed
	// (liveness.go): the requests in flight are cut off.
	cancelled
)

// session is one deliver job's turn at its destination. Every field is
// read and written by the session's goroutine only; requests and the
// recorder's writes report back on channels.
type session struct {
	r     *Relay
	dest  uuid.UUID
	token uuid.UUID
	ep    outboxdb.DestinationLeaseRow

	mode mode
	pace *pace
	rec  *recorder
	// health is the destination's health as last stored or announced.
	health string

	results  chan sent
	woken    chan struct{} // a commit for the destination (listen.go)
	inFlight int
	// ready holds messages claimed ahead, not sent yet (in claim order).
	ready []outboxdb.MessageClaimRow
	// claimFailed: a claim statement failed, and may have committed rows
	// the job never saw; the settle releases them too.
	claimFailed bool
	// opened caches the endpoint's secrets decrypted, by stored value.
	opened map[string]string
	// claimTook and answerTook are moving averages of a claim's round
	// trip and of a request's, which set how far ahead it claims (lead).
	claimTook, answerTook time.Duration
}

// claim is one claim statement's end: the rows it claimed of the asked,
// and its round trip.
type claim struct {
	rows  []outboxdb.MessageClaimRow
	asked int
	err   error
	took  time.Duration
}

// The claim-ahead rule's bounds (claimSize).
const (
	// windowsAhead is how many windows may be claimed and not yet answered
	// for each window kept ready: the next claim's round trip overlaps the
	// requests in flight, and a claim takes a few windows' worth for about
	// the cost of one (its statement's fixed cost is most of it below a
	// hundred rows).
	windowsAhead = 4
	// maxLead bounds lead: sixteen windows claimed ahead at most, 512
	// messages at the default ceiling.
	maxLead = 4
)

// claimSize is the claim-ahead rule: how many messages to claim now, 0 for
// none. While probing, the one probe. While sending, the session keeps
// lead windows ready to send (a window is what the pace lets be in
// flight), and up to lead × windowsAhead windows claimed and not yet
// answered, at most BatchSize in one claim. It claims nothing while
// unrecordedMax outcomes wait to be written: when the database records
// slower than the receiver answers, the job slows to the recording's pace
// instead of claiming the whole backlog.
func (s *session) claimSize() int {
	if s.rec.unwritten() >= unrecordedMax {
		return 0
	}
	window := s.pace.room(0)
	ready, ahead := window, window
	if s.pace.state == stateSending {
		lead := s.lead()
		ready, ahead = lead*window, lead*windowsAhead*window
	}
	outstanding := len(s.ready) + s.inFlight
	if len(s.ready) >= ready || outstanding >= ahead {
		return 0
	}
	return min(ahead-outstanding, s.r.cfg.BatchSize)
}

// lead is how many windows of messages the session keeps ready to send
// while it claims more: as many as go out during a claim's round trip
// (a window's requests take answerTook, a claim claimTook), at least one
// and at most maxLead. To a slow receiver one window is plenty, and a
// claim lasts about as long as its request. To one that answers faster
// than the database claims, a single window ran out before the next claim
// came back: the session waited on its claims for about 40 % of the
// drain of one destination's backlog (docs/design.md).
func (s *session) lead() int {
	if s.answerTook <= 0 {
		return 1
	}
	return min(maxLead, max(1, int((s.claimTook+s.answerTook-1)/s.answerTook)))
}

// average moves a moving average a step toward sample; the first sample
// starts it.
func average(avg, sample time.Duration) time.Duration {
	if avg == 0 {
		return sample
	}
	return avg + (sample-avg)/8
}

// sent is one request's end.
type sent struct {
	row      outboxdb.MessageClaimRow
	res      Result
	span     trace.Span
	started  time.Time
	finished time.Time
	// seq numbers the request and concurrent is how many were in flight to
	// the destination, itself included, when it started (pace.answer).
	seq        uint64
	concurrent int
	// kind is the destination's kind.
	kind string
	// notSent: the job was cancelled before the request began.
	notSent bool
	// interrupted: the job was cancelled while the request was in flight.
	interrupted bool
}

// run serves the destination until its slice ends, it runs out of due
// work, or the job is stopped, starting with first, the messages the lease
// claimed; then it settles.
func (s *session) run(ctx context.Context, first []outboxdb.MessageClaimRow) error {
	r := s.r
	s.ready = first
	s.health = s.ep.Health
	// Requests run on their own context: a hard stop, or a lapse of the
	// relay's liveness, cancels them, and their outcomes are still recorded
	// on the job's.
	sendCtx, cancelSends := context.WithCancel(ctx)
	defer cancelSends()
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	sliceEnds := time.Now().Add(deliverSlice)

	var (
		// dueLeft: the last claim found all it asked for; else nothing
		// more is claimed before the next poll (or a wake-up).
		dueLeft    = len(first) == firstClaim
		idle       int
		claimFails int
		claiming   bool
		claimed    = make(chan claim, 1)
		// Closed channels fire at every select: each is waited on once.
		drain, done = r.drain, ctx.Done()
	)
	for {
		switch {
		case s.mode != cancelled && !r.alive():
			// Others may soon declare this relay dead and send its claims
			// again: its own requests end first.
			s.mode = cancelled
			cancelSends()
		case s.mode == serving && (r.draining() || time.Now().After(sliceEnds)):
			s.mode = draining
		}
		// What was claimed ahead goes out as the window allows; once the
		// job stops sending, it goes back unsent.
		if s.mode == serving && s.pace.sending() {
			for len(s.ready) > 0 && s.pace.room(s.inFlight) > 0 {
				s.start(sendCtx, s.ready[0])
				s.ready = s.ready[1:]
			}
		} else {
			for _, row := range s.ready {
				s.rec.release(row.ID, orEmpty(row.OrderingKey))
			}
			s.ready = nil
		}
		// Claim ahead, beside the requests in flight (claimSize): the
		// claim's round trip overlaps the requests, and a claim takes
		// dozens of messages for about the cost of one.
		if s.mode == serving && s.pace.sending() && dueLeft && !claiming {
			if n := s.claimSize(); n > 0 {
				claiming = true
				go func() {
					began := time.Now()
					rows, err := s.claim(ctx, n)
					claimed <- claim{rows: rows, asked: n, err: err, took: time.Since(began)}
				}()
			}
		}
		if s.inFlight == 0 && !claiming && len(s.ready) == 0 && s.rec.idle() &&
			(s.mode != serving || !s.pace.sending() || idle >= idlePolls || !dueLeft && r.othersDue.Load()) {
			break
		}
		select {
		case c := <-claimed:
			claiming = false
			if c.err == nil {
				s.claimTook = average(s.claimTook, c.took)
			}
			switch {
			case c.err != nil:
				// Try again at the next poll; after three failures in a
				// row, leave the destination to the next job.
				claimFails++
				s.claimFailed = true
				dueLeft = false
				if claimFails >= 3 && ctx.Err() == nil {
					r.logger.WarnContext(ctx, "claiming messages", slog.String("destination", s.dest.String()), slog.Any("error", c.err))
					s.mode = draining
				}
			case len(c.rows) < c.asked:
				dueLeft = false // nothing more is due now; look again at the next poll
				claimFails = 0
			default:
				claimFails = 0
			}
			if len(c.rows) > 0 {
				idle = 0
			}
			s.ready = append(s.ready, c.rows...)
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
			if s.rec.waiting() >= flushSize {
				s.rec.flush(ctx)
			}
		case w := <-s.rec.done:
			recorded := s.rec.finished(ctx, w)
			r.counted(ctx, s.dest, recorded)
			// After a failure the next try waits for the poll: a database
			// that is away would be retried in a tight loop.
			if w.err == nil && s.rec.waiting() >= flushSize {
				s.rec.flush(ctx)
			}
		case <-poll.C:
			s.rec.flush(ctx)
			if !dueLeft && s.inFlight == 0 {
				idle++
			}
			dueLeft = true
		case <-s.woken:
			// A commit for this destination (OUTBOX_NOTIFY): look now
			// rather than at the next poll.
			dueLeft = true
		case <-drain:
			drain = nil
			if s.mode == serving {
				s.mode = draining
			}
		case <-done:
			done, s.mode = nil, cancelled
			cancelSends()
		}
	}
	return s.settle(ctx)
}

// claim claims up to n of the destination's due messages (order.go).
func (s *session) claim(ctx context.Context, n int) ([]outboxdb.MessageClaimRow, error) {
	rows, err := claimMessages(ctx, s.r.pool, outboxdb.MessageClaimParams{
		ClaimToken: s.token, RelayID: s.r.id, Destination: s.dest, BatchSize: int32(n),
	})
	if err != nil {
		return nil, fmt.Errorf("claiming messages: %w", err)
	}
	s.r.claimed(len(rows))
	return rows, nil
}

// claimed counts n messages claimed, and notes the progress.
func (r *Relay) claimed(n int) {
	if n == 0 {
		return
	}
	r.metrics.claimed.Add(float64(n))
	// progressAt measures idleness on this process's clock; claimedAt is
	// written to the database (on its clock, by the heartbeat).
	r.progressAt.Store(time.Now().UnixNano())
	r.claimedAt.Store(r.now().UnixNano())
}

// start sends one claimed message, in a goroutine of its own. The
// destination is checked again (a row stored before a rule, such as a
// broker's control surface, is not sent), and a broker destination signs
// nothing: its secret is never opened, so one that does not decrypt holds
// nothing up.
func (s *session) start(ctx context.Context, row outboxdb.MessageClaimRow) {
	dest, err := destination.Parse(row.EndpointUrl)
	sign := signing{}
	switch {
	case err != nil:
		sign.err = fmt.Errorf("not sent: %w", err)
	case dest.Kind == destination.KindWebhook:
		sign = s.signing(row)
	}
	s.inFlight++
	seq := s.pace.send()
	go s.send(ctx, row, dest, sign, seq, s.inFlight)
}

// send makes one request and reports its end on s.results.
func (s *session) send(ctx context.Context, row outboxdb.MessageClaimRow, dest destination.Destination, sign signing, seq uint64, concurrent int) {
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
	s.results <- sent{row: row, res: res, span: span, started: started, finished: r.now(), seq: seq, concurrent: concurrent,
		kind: dest.Kind, interrupted: res.Err != nil && ctx.Err() != nil}
}

// handle takes one request's end: what it says of the destination to the
// pace, and what comes of the message to the recorder.
func (s *session) handle(ctx context.Context, res sent) {
	s.inFlight--
	key := orEmpty(res.row.OrderingKey)
	if res.notSent {
		s.rec.release(res.row.ID, key)
		return
	}
	s.answerTook = average(s.answerTook, res.finished.Sub(res.started))
	o := s.r.cfg.judge(res.row.ID, key, int(res.row.Attempts), res.res, res.interrupted, res.started, res.finished)
	o.eventAt, o.kind = res.row.CreatedAt, res.kind
	wasProbing := s.pace.state == stateProbing
	throttled := s.pace.answer(signalOf(res.res, res.interrupted), res.seq, res.concurrent,
		s.r.dbTime(res.finished).Add(retryAfter(res.res)), o.err)
	if throttled {
		o.status, o.label = outbox.StatusPending, labelThrottled
		endDeliverSpan(res.span, res.res, o)
		s.r.counted(ctx, s.dest, []outcome{o})
		s.rec.release(res.row.ID, key)
		return
	}
	endDeliverSpan(res.span, res.res, o)
	s.rec.record(o)
	if wasProbing && s.pace.state == stateSending {
		s.recovered(ctx)
	}
}

// recovered marks a destination that was backing off healthy again, at
// once, so the ops page and the other relays see it while this job goes on,
// and makes due the retries the outage pushed back (MessagesBringForward). If
// that write fails, the settle stores the health and says it; the retries
// then keep their schedule.
func (s *session) recovered(ctx context.Context) {
	r := s.r
	// Bounded: the session's loop waits on it, and holds the lease meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var forward int64
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
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

// settle ends the job: in one transaction it records what the recorder has
// left, releases what was claimed and never sent, promotes their keys, and
// stores the destination's health and pace and frees its lease; when work
// is due for the freed worker it wakes the dispatch, which queues the next
// job. It runs even when the job's context was cancelled. If the database
// cannot be reached, the relay retries the same writes at its next
// heartbeats (deferSettle); until then the destination stays leased by
// this live relay, and its claims wait, recorded late rather than sent
// twice.
func (s *session) settle(ctx context.Context) error {
	r := s.r
	ctx = context.WithoutCancel(ctx)
	health, backoffUntil, reason, failures := s.pace.verdict(r.dbNow(), r.cfg)
	left := s.rec.pending
	var recorded []outcome
	var due bool
	write := func(ctx context.Context) error {
		return s.settleWrite(ctx, left, &recorded, &due, health, backoffUntil, reason, failures)
	}
	ended := func(ctx context.Context) {
		r.counted(ctx, s.dest, recorded)
		s.announce(ctx, health, backoffUntil)
		// The job's worker is free: when work is due for it (this
		// destination's, or others' that the last dispatch had no room
		// for), the dispatch runs now rather than at its next poll. One
		// order to 10,000 endpoints went at one poll's room per poll
		// interval, 1,000 a second, with cores idle.
		if due || r.othersDue.Load() {
			r.wakeDispatch()
		}
	}
	settleCtx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	// River completes the job once Work returns, in batches with others';
	// a job whose completion is lost with its process is rescued later and
	// finds nothing to do, or serves the destination as any job would.
	if err := write(settleCtx); err != nil {
		// Retried by the heartbeat loop until it succeeds; the River job is
		// left to River's retry, which finds the lease and does nothing.
		r.deferSettle(func(ctx context.Context) error {
			if err := write(ctx); err != nil {
				return err
			}
			// Counted and said once recorded, as on time.
			ended(ctx)
			return nil
		})
		return fmt.Errorf("settling deliver job for %s: %w", s.dest, err)
	}
	ended(ctx)
	return nil
}

// settleWrite is the settle's writes, in one transaction under generic
// plans (planned once per connection, see TransactionPlanGeneric): the
// destination's lock, the last outcomes recorded and the unsent released
// with their keys promoted (the recorder's batch), the claims of a failed
// claim statement released and promoted, and the destination's health and
// pace stored and its lease freed (DestinationSettle, which says whether
// work is due). Without a failed claim it is one batch, one round trip: a
// job's end is most of a one-message job's writes (one order fanned out to
// thousands of endpoints).
func (s *session) settleWrite(ctx context.Context, left batch, recorded *[]outcome, due *bool,
	health string, backoffUntil *time.Time, reason *string, failures int,
) error {
	params := outboxdb.DestinationSettleParams{
		ID: s.dest, LeaseToken: s.token, Url: s.ep.Url, Health: health, HealthReason: reason,
		ConsecutiveFailures: int32(failures), BackoffUntil: backoffUntil, Gone: s.pace.state == stateGone,
		Pace: s.pace.remembered(),
	}
	// held: the lease is still this job's. Once it is not (this relay was
	// declared dead, or the endpoint deleted), whoever holds it decides,
	// and nothing is due of this job.
	var held bool
	record := func(b *pgx.Batch) func() error {
		outboxdb.QueueDestinationLock(b, s.dest)
		outboxdb.QueueTransactionPlanGeneric(b)
		return s.rec.queue(b, left, recorded)
	}
	if !s.claimFailed {
		err := s.r.sendBatch(ctx, s.r.pool, func(b *pgx.Batch) func() error {
			check := record(b)
			outboxdb.QueueDestinationSettle(b, params, due, &held)
			return check
		})
		if err != nil {
			return fmt.Errorf("settling destination: %w", err)
		}
		*due = *due && held
		return nil
	}
	// A claim statement failed and may have claimed rows the job never
	// saw: after its outcomes are recorded, whatever is still claimed
	// under its token goes back.
	return pgx.BeginFunc(ctx, s.r.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		if err := s.r.sendBatch(ctx, tx, record); err != nil {
			return fmt.Errorf("settling destination: %w", err)
		}
		keys, err := q.MessagesReleaseByToken(ctx, s.token)
		if err != nil {
			return fmt.Errorf("releasing messages of failed claims: %w", err)
		}
		if err := promote(ctx, q, s.dest, keys); err != nil {
			return err
		}
		*due, err = q.DestinationSettle(ctx, params)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("settling destination: %w", err)
		}
		return nil
	})
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
			slog.String("error", s.pace.lastFailure), slog.Int("consecutive_failures", s.pace.failures),
			slog.Time("next_probe_at", *backoffUntil))
	case health == outbox.HealthHealthy && s.health == outbox.HealthBackingOff:
		s.announceRecovered(ctx)
	}
	if s.pace.state == stateGone {
		r.metrics.stateChanges.WithLabelValues(outbox.HealthPaused).Inc()
		r.logger.WarnContext(ctx, "destination paused: the receiver answered 410 Gone; its messages wait until it is enabled again",
			dest, slog.String("url", s.ep.Url))
	}
}

func orEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
