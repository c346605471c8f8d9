package relay

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Per-key order. For one destination and one ordering key, a message is
// sent only when nothing of the key is in flight and nothing before it is
// unfinished (the SQL function outbox_key_ahead is that rule, once). Two
// statements keep it, both under the destination's lock (DestinationLock):
// the claim parks a due message the rule holds back (claimMessages), and
// whatever lets a key go on promotes the key's first parked message
// (promote, and the recorder's batches). The lock is taken in a statement
// before theirs, so they run one at a time per destination and each sees
// what the previous one committed: a promotion never misses a message a
// claim parked, and a claim never parks a message behind one that is
// already settled. A parked message thus waits only while something
// stands ahead of it.
//
// The same lock fences the lease: a takeover takes it too (Relay.lease),
// so a claim reads the lease's token after any takeover committed, or
// before it began. And every transaction that takes the lock takes it
// first, before any row: with the endpoint's row locked last (and a
// deletion, which locks that row right after the destination's lock,
// never waiting for a message), no two transactions can wait for each
// other in a cycle.

// claimMessages runs MessageClaim on db (the pool, or a transaction whose
// later statements then run under generic plans too) under the
// destination's lock and TransactionPlanGeneric, in one round trip.
func claimMessages(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, p outboxdb.MessageClaimParams,
) ([]outboxdb.MessageClaimRow, error) {
	var rows []outboxdb.MessageClaimRow
	b := &pgx.Batch{}
	outboxdb.QueueDestinationLock(b, p.Destination)
	outboxdb.QueueTransactionPlanGeneric(b)
	outboxdb.QueueMessageClaim(b, p, &rows)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return rows, nil
}

// promote lets the keys of messages that left their claim (or their
// failure) go on, in a transaction that took the destination's lock first.
func promote(ctx context.Context, q *outboxdb.Queries, dest uuid.UUID, keys []*string) error {
	var ks []string
	for _, k := range keys {
		if k != nil {
			ks = append(ks, *k)
		}
	}
	if len(ks) == 0 {
		return nil
	}
	if _, err := q.MessagesPromote(ctx, ks, dest); err != nil {
		return fmt.Errorf("promoting parked messages: %w", err)
	}
	return nil
}
