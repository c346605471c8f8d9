package relay

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
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

// deliver records the claimed row delivered at its first attempt.
func (k pair) deliver(row outboxdb.MessageClaimRow) {
	now := time.Now()
	n, err := outboxdb.New(k.pool).MessagesRecordOutcomes(context.Background(), outboxdb.MessagesRecordOutcomesParams{
		Ids: []uuid.UUID{row.ID}, Statuses: []string{outbox.StatusDelivered}, DelaysSeconds: []float64{0}, LastErrors: []string{""},
		Attempts: []int32{row.Attempts + 1}, Outcomes: []string{labelDelivered}, StartedAts: []time.Time{now},
		FinishedAts: []time.Time{now}, StatusCodes: []int32{204}, ClaimToken: k.lease})
	require.NoError(k.t, err)
	require.EqualValues(k.t, 1, n, "recorded on the claim the test holds")
}
