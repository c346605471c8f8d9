package relay

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// recorder writes back what came of a session's requests: each outcome
// with its attempt (MessagesRecordOutcomes), the messages to release
// without one (never sent, or throttled: MessagesRelease), and then the
// keys of all of them promoted (MessagesPromote), under the destination's
// lock taken first. Every message that leaves its claim goes through it,
// so every key that may go on is promoted, in the same transaction as the
// write that lets it.
//
// It writes one batch at a time, in the order outcomes came, beside the
// session's claims and requests (River's job completer has the same
// shape): a destination's throughput is not the sum of its statements'
// latencies. A batch that fails is put back, first, for the next one or
// the job's end. Only what a batch recorded is counted and logged: a claim
// released meanwhile (lost, or its endpoint deleted) records nothing.
type recorder struct {
	r     *Relay
	dest  uuid.UUID
	token uuid.UUID

	// pending is what waits to be written; writing, what a batch in flight
	// writes. Both are read and written by the session's goroutine only.
	pending, writing batch
	busy             bool
	// done reports a batch's end to the session.
	done chan written
	// warnedAt is when a failed write was last said: while the database is
	// away a write fails at every poll.
	warnedAt time.Time
}

// batch is what one write records.
type batch struct {
	outcomes []outcome
	released []uuid.UUID
	keys     map[string]struct{}
}

func (b batch) empty() bool { return len(b.outcomes) == 0 && len(b.released) == 0 }

// size is how many messages the batch settles.
func (b batch) size() int { return len(b.outcomes) + len(b.released) }

func (b *batch) addKey(key string) {
	if key == "" {
		return
	}
	if b.keys == nil {
		b.keys = map[string]struct{}{}
	}
	b.keys[key] = struct{}{}
}

// then is b with c after it.
func (b batch) then(c batch) batch {
	out := batch{outcomes: append(b.outcomes, c.outcomes...), released: append(b.released, c.released...)}
	for k := range b.keys {
		out.addKey(k)
	}
	for k := range c.keys {
		out.addKey(k)
	}
	return out
}

// written is the end of one write: the outcomes it recorded.
type written struct {
	recorded []outcome
	err      error
}

func newRecorder(r *Relay, dest, token uuid.UUID) *recorder {
	return &recorder{r: r, dest: dest, token: token, done: make(chan written, 1)}
}

// record queues an outcome.
func (rc *recorder) record(o outcome) {
	rc.pending.outcomes = append(rc.pending.outcomes, o)
	rc.pending.addKey(o.key)
}

// release queues a claimed message to go back to pending without an
// attempt.
func (rc *recorder) release(id uuid.UUID, key string) {
	rc.pending.released = append(rc.pending.released, id)
	rc.pending.addKey(key)
}

// idle says no write is in flight.
func (rc *recorder) idle() bool { return !rc.busy }

// waiting is how many messages wait to be written.
func (rc *recorder) waiting() int { return rc.pending.size() }

// unwritten is how many messages wait to be written or are being written.
func (rc *recorder) unwritten() int { return rc.pending.size() + rc.writing.size() }

// flush starts writing what is pending, unless a write is in flight (one
// at a time, so outcomes are written in the order they came) or ctx is
// done (the job's end writes what is left, on a context of its own).
func (rc *recorder) flush(ctx context.Context) {
	if rc.pending.empty() || rc.busy || ctx.Err() != nil {
		return
	}
	rc.writing, rc.pending, rc.busy = rc.pending, batch{}, true
	b := rc.writing
	go func() {
		var recorded []outcome
		err := rc.write(ctx, rc.r.pool, b, &recorded)
		rc.done <- written{recorded: recorded, err: err}
	}()
}

// write records b on db in one round trip (one transaction): under the
// destination's lock when keys are to be promoted, and under generic plans
// (planned once per connection, see TransactionPlanGeneric).
func (rc *recorder) write(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, b batch, recorded *[]outcome,
) error {
	if b.empty() {
		return nil
	}
	return rc.r.sendBatch(ctx, db, func(q *pgx.Batch) func() error {
		if len(b.keys) > 0 {
			outboxdb.QueueDestinationLock(q, rc.dest)
		}
		outboxdb.QueueTransactionPlanGeneric(q)
		return rc.queue(q, b, recorded)
	})
}

// finished takes a write's end: it returns what the write recorded, or
// puts its batch back in front of what came since.
func (rc *recorder) finished(ctx context.Context, w written) []outcome {
	rc.busy = false
	if w.err != nil {
		if ctx.Err() == nil && time.Since(rc.warnedAt) > 30*time.Second {
			rc.warnedAt = time.Now()
			rc.r.logger.WarnContext(ctx, "recording delivery outcomes", slog.String("destination", rc.dest.String()), slog.Any("error", w.err))
		}
		rc.pending = rc.writing.then(rc.pending)
		rc.writing = batch{}
		return nil
	}
	rc.writing = batch{}
	return w.recorded
}

// queue adds b's statements to q: the outcomes, the releases, the
// promotion. The caller queues the destination's lock before them when
// keys are to be promoted (write, settleWrite). The returned func checks
// what the statements did once q has been sent, and sets *recorded to the
// outcomes that were recorded.
func (rc *recorder) queue(q *pgx.Batch, b batch, recorded *[]outcome) func() error {
	keys := slices.Sorted(maps.Keys(b.keys))
	var rows []outboxdb.MessagesRecordOutcomesRow
	if len(b.outcomes) > 0 {
		outboxdb.QueueMessagesRecordOutcomes(q, rc.params(b.outcomes), &rows)
	}
	if len(b.released) > 0 {
		outboxdb.QueueMessagesRelease(q, b.released, rc.token, nil)
	}
	if len(keys) > 0 {
		outboxdb.QueueMessagesPromote(q, keys, rc.dest, nil)
	}
	return func() error {
		done := make(map[uuid.UUID]int32, len(rows))
		for _, r := range rows {
			done[r.ID] = r.Attempts
		}
		*recorded = (*recorded)[:0]
		for _, o := range b.outcomes {
			if n, ok := done[o.id]; ok && int(n) == o.attempt {
				*recorded = append(*recorded, o)
			}
		}
		return nil
	}
}

func (rc *recorder) params(outcomes []outcome) outboxdb.MessagesRecordOutcomesParams {
	p := outboxdb.MessagesRecordOutcomesParams{ClaimToken: rc.token}
	for i, o := range outcomes {
		if i == 0 || bytes.Compare(o.id[:], p.FirstID[:]) < 0 {
			p.FirstID = o.id
		}
		if i == 0 || bytes.Compare(o.id[:], p.LastID[:]) > 0 {
			p.LastID = o.id
		}
		p.Ids = append(p.Ids, o.id)
		p.Statuses = append(p.Statuses, o.status)
		p.DelaysSeconds = append(p.DelaysSeconds, o.delay.Seconds())
		p.LastErrors = append(p.LastErrors, truncate(o.err, 500))
		p.Attempts = append(p.Attempts, int32(o.attempt))
		p.Outcomes = append(p.Outcomes, o.label)
		p.StartedAts = append(p.StartedAts, rc.r.dbTime(o.started))
		p.FinishedAts = append(p.FinishedAts, rc.r.dbTime(o.finished))
		p.StatusCodes = append(p.StatusCodes, int32(o.code))
		p.EventAts = append(p.EventAts, o.eventAt)
	}
	return p
}

// counted updates the metrics and logs for recorded outcomes (and
// throttles, which are no attempt and record nothing): only what was
// recorded, so the counters agree with the table.
func (r *Relay) counted(ctx context.Context, dest uuid.UUID, recorded []outcome) {
	endpoint := dest.String()
	for _, o := range recorded {
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
		if o.status == outbox.StatusDelivered || o.status == outbox.StatusFailed {
			// From its event's writing to this outcome, on the database's
			// clock: its retries' waits included.
			lag := r.dbTime(o.finished).Sub(o.eventAt).Seconds()
			r.metrics.deliveryLag.WithLabelValues(cmp.Or(o.kind, destination.KindWebhook), o.status).Observe(lag)
			if r.metrics.byEndpointLag != nil {
				r.metrics.byEndpointLag.WithLabelValues(endpoint, o.status).Observe(lag)
			}
		}
		if o.status == outbox.StatusFailed {
			r.logger.WarnContext(ctx, "message failed", slog.String("message_id", o.id.String()),
				slog.String("destination", endpoint), slog.String("error", o.err))
		}
	}
	if r.metrics.byEndpoint != nil && len(recorded) > 0 {
		r.metrics.sawEndpoint(dest)
	}
}

// sendBatch sends the statements build queues, as one implicit transaction
// in one round trip on db (the pool, or a transaction), and runs the check
// build returned once they have run.
func (r *Relay) sendBatch(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, build func(*pgx.Batch) func() error,
) error {
	b := &pgx.Batch{}
	check := build(b)
	if b.Len() == 0 {
		return nil
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("recording: %w", err)
	}
	return check()
}
