package relay

// Partitions: outbox_events, outbox_messages and outbox_attempts are
// partitioned by range of their time-ordered ids, cut at the same times
// (migration 00038). The prune job keeps partitions made ahead of the
// writes, and drops a partition of each table together once every
// message in it is settled and past its retention: a drop costs the same
// however many rows it removes, where a DELETE writes WAL and leaves a
// dead tuple per row.
//
// The rule a drop keeps fits in a sentence: a partition is detached only
// under locks that stop anything else from reading or writing it, after
// PartitionHeld found, under those locks, nothing that must be kept; once
// detached, no statement on the outbox tables sees it, and it is dropped
// (dropDetached: any detached partition, so one a dead relay detached is
// dropped by the next prune job). The
// locks are the parent tables' (ACCESS EXCLUSIVE, which every statement on
// a partition waits for, so no claim, record or retry is in it) and the
// events' prune lock, which a replay (the one writer of new messages for
// old events) holds shared. The parents' lock stops the order transactions
// too, for the milliseconds the check and the detach take; a drop waits
// for it at most 100 ms (PartitionLockDrop), then gives up and tries
// again.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// partitionTables are the tables partitioned together.
var partitionTables = []string{"outbox_events", "outbox_messages", "outbox_attempts"}

// partitionDropTries bounds the attempts at one drop whose locks were not
// had within the lock timeout (PartitionLockDrop), a second apart.
const partitionDropTries = 5

// partitionsKept is what one pass of retainPartitions left: the partitions
// past their retention that something holds, and the id before which
// their settled rows are deleted one by one instead.
type partitionsKept struct {
	// held is why each partition past its retention was kept, by suffix.
	held map[string]string
	// before is the upper bound of the newest partition past its
	// retention (the nil UUID when none is): the ids MessagesPrune and
	// EventsPrune work below.
	before uuid.UUID
	// beforeAt is before as a time.
	beforeAt time.Time
}

// retainPartitions drops what an earlier drop detached and left, makes
// partitions through now plus PartitionsAhead, then drops every partition
// past its retention (its upper bound before cutoff) that nothing holds.
// It returns the suffixes it dropped and what it kept.
func (r *Relay) retainPartitions(ctx context.Context, now, cutoff time.Time) (dropped []string, kept partitionsKept, err error) {
	// First what a relay that died mid-drop left: a partition made again
	// in the same span would take its name.
	if err := r.dropDetached(ctx); err != nil {
		return nil, kept, err
	}
	q := outboxdb.New(r.pool)
	created, err := q.PartitionsExtend(ctx, now.Add(r.cfg.PartitionsAhead), r.cfg.PartitionSpan.Seconds())
	if err != nil {
		return nil, kept, fmt.Errorf("creating partitions: %w", err)
	}
	if created > 0 {
		r.logger.InfoContext(ctx, "created outbox partitions", slog.Int("count", int(created)),
			slog.Duration("span", r.cfg.PartitionSpan))
	}
	parts, err := q.Partitions(ctx)
	if err != nil {
		return nil, kept, fmt.Errorf("listing partitions: %w", err)
	}
	kept.held = map[string]string{}
	for _, p := range parts {
		if !p.HiAt.Before(cutoff) {
			break // oldest first: the rest are newer still
		}
		held, err := r.dropPartition(ctx, p, cutoff)
		if err != nil {
			// Dropped at the next run: not deleted row by row meanwhile.
			return dropped, kept, err
		}
		kept.before, kept.beforeAt = p.Hi, p.HiAt
		if held != "" {
			kept.held[p.Suffix] = held
			continue
		}
		dropped = append(dropped, p.Suffix)
		r.metrics.partitionsDropped.Inc()
	}
	return dropped, kept, nil
}

// dropPartition drops partition p of the three tables unless something
// holds it, and returns what does ("" when it was dropped).
func (r *Relay) dropPartition(ctx context.Context, p outboxdb.PartitionsRow, cutoff time.Time) (held string, err error) {
	// Asked first without locks, so that a partition a pending message
	// holds costs the tables no lock at all.
	held, err = outboxdb.New(r.pool).PartitionHeld(ctx, p.Lo, p.Hi, cutoff)
	if err != nil || held != "" {
		return held, wrapPartition(p, err)
	}
	for try := 1; ; try++ {
		err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			q := outboxdb.New(tx)
			if err := q.PartitionLockDrop(ctx); err != nil {
				return err
			}
			// Not while a replay gives old events new messages.
			if err := q.EventsLockPrune(ctx); err != nil {
				return err
			}
			// The parents, in the order the writers take them (an order
			// transaction writes events, then messages; a record, messages,
			// then attempts): every reader and writer of a partition opens
			// its parent first, so this shuts them all out for the drop.
			if _, err := tx.Exec(ctx, "LOCK TABLE ONLY outbox_events, outbox_messages, outbox_attempts IN ACCESS EXCLUSIVE MODE"); err != nil {
				return err
			}
			// Again under the locks: a requeue or a replay may have
			// committed since.
			if held, err = q.PartitionHeld(ctx, p.Lo, p.Hi, cutoff); err != nil || held != "" {
				return err
			}
			// Detached, not dropped: removing the files takes time that
			// grows with them (hundreds of milliseconds for a day of a
			// million messages), and the parents stay locked until the
			// transaction that drops them commits.
			for _, t := range partitionTables {
				if _, err := tx.Exec(ctx, "ALTER TABLE "+pgx.Identifier{t}.Sanitize()+" DETACH PARTITION "+
					pgx.Identifier{t + "_" + p.Suffix}.Sanitize()); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil && held == "" {
			err = r.dropDetached(ctx)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" && try < partitionDropTries { // lock_not_available
			select {
			case <-ctx.Done():
				return "", ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		return held, wrapPartition(p, err)
	}
}

// dropDetached drops the partitions of the three tables that a drop
// detached: the ones it just detached, and any a relay that died between
// the detach and the drop left.
func (r *Relay) dropDetached(ctx context.Context) error {
	names, err := outboxdb.New(r.pool).PartitionsDetached(ctx)
	if err != nil || len(names) == 0 {
		return err
	}
	for i, n := range names {
		names[i] = pgx.Identifier{n}.Sanitize()
	}
	if _, err := r.pool.Exec(ctx, "DROP TABLE "+strings.Join(names, ", ")); err != nil {
		return fmt.Errorf("dropping detached partitions: %w", err)
	}
	return nil
}

func wrapPartition(p outboxdb.PartitionsRow, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("dropping outbox partition %s: %w", p.Suffix, err)
}
