package relay

// Retention, run by River's leader as periodic jobs: the prune of settled
// rows past their retention, the discard of messages whose endpoint is
// gone, and the chores a service adds (Config.Chores).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// pruneArgs starts one prune of settled rows past the retention.
type pruneArgs struct{}

// Kind implements river.JobArgs.
func (pruneArgs) Kind() string { return "outbox_prune" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (pruneArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: queuePrune, MaxAttempts: 1}
}

type pruneWorker struct {
	river.WorkerDefaults[pruneArgs]
	relay *Relay
}

// pruneBatch keeps each delete short, so its locks and WAL never stall the
// claims or the order transactions running beside it.
const pruneBatch = 5000

// pruneTimeout bounds one prune job; an unfinished prune goes on at the
// next interval.
const pruneTimeout = 10 * time.Minute

func (w *pruneWorker) Timeout(*river.Job[pruneArgs]) time.Duration { return pruneTimeout }

func (w *pruneWorker) Work(ctx context.Context, job *river.Job[pruneArgs]) error {
	r := w.relay
	now := r.dbNow() // the cutoffs are compared with the rows' times, which the database wrote
	cutoff := now.Add(-r.cfg.Retention)
	// A partition that could not be made or dropped is tried again at the
	// next run; the rest of the prune goes on meanwhile.
	dropped, kept, partErr := r.retainPartitions(ctx, now, cutoff)
	if len(dropped) > 0 {
		r.logger.InfoContext(ctx, "dropped outbox partitions", slog.Any("partitions", dropped),
			slog.Duration("retention", r.cfg.Retention))
	}
	for suffix, why := range kept.held {
		r.logger.InfoContext(ctx, "kept outbox partition past its retention", slog.String("partition", suffix),
			slog.String("held_by", why))
	}
	n, failed, err := r.prune(ctx, cutoff, now.Add(-r.cfg.FailedRetention), kept)
	err = errors.Join(partErr, err)
	if n > 0 {
		r.logger.InfoContext(ctx, "pruned settled messages", slog.Int64("count", n),
			slog.Duration("retention", r.cfg.Retention))
	}
	if failed > 0 {
		r.logger.InfoContext(ctx, "pruned failed messages", slog.Int64("count", failed),
			slog.Duration("failed_retention", r.cfg.FailedRetention))
	}
	if err != nil {
		return err
	}
	for {
		n, err := outboxdb.New(r.pool).AttemptMinutesPrune(ctx, now.Add(-attemptMinutesKept), pruneBatch)
		if err != nil {
			return fmt.Errorf("pruning attempts by minute: %w", err)
		}
		if n < pruneBatch {
			break
		}
	}
	for {
		n, err := outboxdb.New(r.pool).DeliveryLagMinutesPrune(ctx, now.Add(-attemptMinutesKept), pruneBatch)
		if err != nil {
			return fmt.Errorf("pruning delivery lags by minute: %w", err)
		}
		if n < pruneBatch {
			break
		}
	}
	return nil
}

// attemptMinutesKept is how long the attempts and delivery lags summed by
// minute (outbox_attempt_minutes, outbox_delivery_lag_minutes) are kept:
// the ops page reads the last day of them, whatever the retention of the
// history they sum.
const attemptMinutesKept = 48 * time.Hour

// orphanArgs starts one discard of messages whose endpoint was deleted.
type orphanArgs struct{}

// Kind implements river.JobArgs.
func (orphanArgs) Kind() string { return "outbox_discard_orphans" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (orphanArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: queuePrune, MaxAttempts: 1}
}

// orphanInterval is how often the relay looks for pending messages of
// deleted endpoints: what a deletion could not discard while its request
// waited (Admin.DeleteEndpoint), and rows written while it ran. Looking is
// one index probe per destination with pending messages.
const orphanInterval = time.Minute

type orphanWorker struct {
	river.WorkerDefaults[orphanArgs]
	relay *Relay
}

func (w *orphanWorker) Timeout(*river.Job[orphanArgs]) time.Duration { return pruneTimeout }

// Work discards in batches of pruneBatch, each its own statement, so its
// locks and WAL never stall the claims or the orders beside it.
func (w *orphanWorker) Work(ctx context.Context, _ *river.Job[orphanArgs]) error {
	r := w.relay
	var total int64
	defer func() {
		if total > 0 {
			r.logger.InfoContext(ctx, "discarded messages of deleted endpoints", slog.Int64("count", total))
		}
	}()
	for {
		n, err := outboxdb.New(r.pool).MessagesDiscardOrphans(ctx, pruneBatch)
		total += n
		if err != nil {
			return fmt.Errorf("discarding messages of deleted endpoints: %w", err)
		}
		if n < pruneBatch {
			return nil
		}
	}
}

// prune deletes, in batches, what dropping partitions leaves: in the
// partitions past their retention that kept holds, delivered messages
// delivered, and discarded messages discarded, before cutoff, and the
// events no message refers to any more; and anywhere, failed messages that
// failed before failedCutoff. Attempts go with their messages. It returns
// how many settled and how many failed messages it deleted. Pending and
// claimed messages, and their events, are kept.
func (r *Relay) prune(ctx context.Context, cutoff, failedCutoff time.Time, kept partitionsKept) (settled, failed int64, err error) {
	q := outboxdb.New(r.pool)
	for kept.before != uuid.Nil {
		n, err := q.MessagesPrune(ctx, cutoff, kept.before, pruneBatch)
		settled += n
		r.metrics.pruned.Add(float64(n))
		if err != nil {
			return settled, failed, fmt.Errorf("pruning settled messages: %w", err)
		}
		if n == 0 {
			break
		}
	}
	dests, err := q.FailedExpiredDestinations(ctx, failedCutoff)
	if err != nil {
		return settled, failed, fmt.Errorf("finding failed messages to prune: %w", err)
	}
	for _, dest := range dests {
		n, err := r.pruneFailed(ctx, dest, failedCutoff)
		failed += n
		r.metrics.pruned.Add(float64(n))
		if err != nil {
			return settled, failed, err
		}
	}
	for after := uuid.Nil; kept.before != uuid.Nil; {
		var row outboxdb.EventsPruneRow
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) (err error) {
			q := outboxdb.New(tx)
			// Not while a replay gives old events new messages.
			if err := q.EventsLockPrune(ctx); err != nil {
				return err
			}
			row, err = q.EventsPrune(ctx, after, kept.beforeAt, pruneBatch)
			return err
		})
		if err != nil {
			return settled, failed, fmt.Errorf("pruning events: %w", err)
		}
		if row.Scanned < pruneBatch {
			return settled, failed, nil
		}
		after = row.LastID
	}
	return settled, failed, nil
}

// pruneFailed deletes one destination's failed messages that failed before
// cutoff, a batch per transaction, each under the destination's lock and
// followed by the promotion of their keys: a failed message pruned lets
// its key go on, as a skipped one does.
func (r *Relay) pruneFailed(ctx context.Context, dest uuid.UUID, cutoff time.Time) (int64, error) {
	var total int64
	for {
		var keys []*string
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) (err error) {
			q := outboxdb.New(tx)
			if err := q.DestinationLock(ctx, dest); err != nil {
				return fmt.Errorf("locking destination: %w", err)
			}
			if keys, err = q.MessagesPruneFailed(ctx, dest, cutoff, pruneBatch); err != nil {
				return err
			}
			return promote(ctx, q, dest, keys)
		})
		if err != nil {
			return total, fmt.Errorf("pruning failed messages: %w", err)
		}
		total += int64(len(keys))
		if len(keys) < pruneBatch {
			return total, nil
		}
	}
}

// choreArgs starts one run of the chore named Name (Config.Chores).
type choreArgs struct {
	Name string `json:"name"`
}

// Kind implements river.JobArgs.
func (choreArgs) Kind() string { return "outbox_chore" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (choreArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: queuePrune, MaxAttempts: 1}
}

type choreWorker struct {
	river.WorkerDefaults[choreArgs]
	relay *Relay
}

func (w *choreWorker) Timeout(*river.Job[choreArgs]) time.Duration { return pruneTimeout }

func (w *choreWorker) Work(ctx context.Context, job *river.Job[choreArgs]) error {
	for _, c := range w.relay.cfg.Chores {
		if c.Name == job.Args.Name {
			if err := c.Run(ctx); err != nil {
				return fmt.Errorf("running chore %s: %w", c.Name, err)
			}
			return nil
		}
	}
	// A job inserted by a relay configured with a chore this one lacks
	// (during a rolling deploy): the next leader that has it runs it.
	return nil
}
