package relay

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// A replayed event keeps its key's order against the messages queued
// before the replay: it is never in flight beside another message of its
// key, and when the one in flight is delivered it goes next. Here a
// receiver that lost its database asks for the key's history while the
// key's second event (order.cancelled, say) is being sent: the first
// (order.placed) must not reach it at the same time, where it could be
// applied after the cancellation.
func TestAReplayedEventWaitsForTheMessageOfItsKeyInFlight(t *testing.T) {
	t.Parallel()
	k := keyedPair(t)
	ctx := context.Background()
	first := k.claim(k.pool, 1)
	require.Len(t, first, 1)
	k.deliver(first[0])
	second := k.claim(k.pool, 10)
	require.Len(t, second, 1, "the second of the key is claimed once the first is delivered")
	require.Equal(t, k.next, second[0].ID)

	adm := admin.New(k.pool, nil, slog.New(slog.DiscardHandler))
	res, err := adm.ReplayEvents(ctx, k.dest, admin.Replay{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed, "the first event is replayed; the second, still in flight, is not copied")

	require.Empty(t, k.claim(k.pool, 10), "the replayed event waits while a message of its key is in flight")
	k.deliver(second[0])
	rows := k.claim(k.pool, 10)
	require.Len(t, rows, 1, "the in-flight message delivered, the replayed event is sent next")
	require.Equal(t, first[0].EventID, rows[0].EventID)
}

// deliver records the claimed row delivered at its first attempt, as the
// deliver job's recorder does.
func (k pair) deliver(row outboxdb.MessageClaimRow) {
	require.NoError(k.t, k.record(row, Result{StatusCode: http.StatusNoContent}))
}

// A replayed event parked behind a later message of its key in flight goes
// next when that message's attempt fails, not only when it is delivered:
// every outcome lets the key go on. Before, only a delivery promoted; the
// copy stayed parked, and when the failed message came due again the claim
// parked it behind the parked copy: the key waited for a sweep, an hour at
// worst, both messages due and nothing in flight.
func TestAReplayedEventGoesNextWhenTheMessageAheadFails(t *testing.T) {
	t.Parallel()
	k := keyedPair(t)
	ctx := context.Background()
	first := k.claim(k.pool, 1)
	require.Len(t, first, 1)
	k.deliver(first[0])
	second := k.claim(k.pool, 10)
	require.Len(t, second, 1)

	adm := admin.New(k.pool, nil, slog.New(slog.DiscardHandler))
	res, err := adm.ReplayEvents(ctx, k.dest, admin.Replay{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	require.Empty(t, k.claim(k.pool, 10), "the copy waits, parked, while the second is in flight")

	// The second's attempt fails: a retry due at once (the schedule's wait
	// aside), so both are due.
	require.NoError(t, k.record(second[0], Result{StatusCode: http.StatusServiceUnavailable}))
	_, err = k.pool.Exec(ctx, `UPDATE outbox_messages SET next_attempt_at = now() WHERE id = $1`, second[0].ID)
	require.NoError(t, err)
	rows := k.claim(k.pool, 10)
	require.Len(t, rows, 1, "the key goes on")
	require.Equal(t, first[0].EventID, rows[0].EventID, "the replayed event first, the key's order")
	require.Empty(t, k.claim(k.pool, 10), "the failed second waits for it")
	k.deliver(rows[0])
	rows = k.claim(k.pool, 10)
	require.Len(t, rows, 1)
	require.Equal(t, second[0].ID, rows[0].ID, "then the second's retry")
}
