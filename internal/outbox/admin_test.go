package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

func TestMessagesFilterAndPaginate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a, b := newReceiver(t), newReceiver(t)
	epA := f.endpoint(t, a, "order.placed", "order.cancelled")
	f.endpoint(t, b, "order.placed")
	var placed []uuid.UUID
	for i := range 7 {
		placed = append(placed, f.enqueue(t, "order.placed", i)...)
	}
	cancelled := f.enqueue(t, "order.cancelled", "x")
	require.Len(t, placed, 14)
	require.Len(t, cancelled, 1)

	// Pages of 5, newest first, cover everything exactly once.
	var seen []uuid.UUID
	var cursor *uuid.UUID
	for {
		page, next, err := f.admin.Messages(ctx, outbox.MessageFilter{Limit: 5, Before: cursor})
		require.NoError(t, err)
		for _, m := range page {
			seen = append(seen, m.ID)
		}
		if next == nil {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 15)
	for i := 1; i < len(seen); i++ {
		require.Less(t, seen[i].String(), seen[i-1].String(), "newest first")
	}

	byType, _, err := f.admin.Messages(ctx, outbox.MessageFilter{Type: "order.cancelled"})
	require.NoError(t, err)
	require.Len(t, byType, 1)
	require.Equal(t, cancelled[0], byType[0].ID)

	byEndpoint, _, err := f.admin.Messages(ctx, outbox.MessageFilter{Destination: &epA.ID})
	require.NoError(t, err)
	require.Len(t, byEndpoint, 8)

	future := time.Now().Add(time.Hour)
	none, _, err := f.admin.Messages(ctx, outbox.MessageFilter{CreatedFrom: &future})
	require.NoError(t, err)
	require.Empty(t, none)

	_, _, err = f.admin.Messages(ctx, outbox.MessageFilter{Status: "lost"})
	require.ErrorIs(t, err, outbox.ErrInvalidStatus)
}
