package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// The event prune looks at each old event once per run: its cursor walks
// past the events a delivery still keeps (waiting for a paused endpoint,
// failed and kept longer), so a batch never reads them again, and the
// events after them that nothing refers to any more are deleted.
func TestEventPruneWalksPastKeptEventsOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	ep := testEndpoint(t, pool, nil)
	kept := Seed(t, pool, ep, 3, "")    // their messages still wait
	settled := Seed(t, pool, ep, 5, "") // delivered, then pruned
	_, err := pool.Exec(ctx, `DELETE FROM outbox_messages WHERE id = ANY ($1)`, settled)
	require.NoError(t, err)
	cutoff := time.Now().Add(time.Second)

	q := outboxdb.New(pool)
	var batches []outboxdb.EventsPruneRow
	for after := uuid.Nil; ; {
		row, err := q.EventsPrune(ctx, after, cutoff, 2)
		require.NoError(t, err)
		batches = append(batches, outboxdb.EventsPruneRow{Scanned: row.Scanned, Deleted: row.Deleted})
		if row.Scanned < 2 {
			break
		}
		after = row.LastID
	}
	require.Equal(t, []outboxdb.EventsPruneRow{{Scanned: 2, Deleted: 0}, {Scanned: 2, Deleted: 1}, {Scanned: 2, Deleted: 2},
		{Scanned: 2, Deleted: 2}, {Scanned: 0, Deleted: 0}}, batches,
		"two kept events looked at once, then one kept and one settled, then the settled ones")
	var events int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&events))
	require.Equal(t, len(kept), events, "the kept events stay, the others are gone")
}

// A deleted endpoint's messages parked behind an earlier one of their key
// are discarded by the orphan job too, also when nothing else of the
// endpoint waits any more (they were found only beside unparked ones).
func TestOrphanJobDiscardsParkedMessagesOfADeletedEndpoint(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	ep := testEndpoint(t, pool, nil)
	ids := Seed(t, pool, ep, 3, "order-1")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET parked = true WHERE id = ANY ($1)`, ids)
	require.NoError(t, err)
	// Deleted with only parked messages left, as a deletion leaves a
	// backlog it could not settle in time once the rest is discarded.
	_, err = pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, ep)
	require.NoError(t, err)
	n, err := outboxdb.New(pool).MessagesDiscardOrphans(ctx, pruneBatch)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status <> 'discarded'`).Scan(&left))
	require.Zero(t, left)
}
