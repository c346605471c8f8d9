package orders_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/orders"
)

// EventKey names exactly the order's events: the key every event of the
// order carries (its placement and its cancellation), which the ops page
// lists them by.
func TestEventKeyIsTheKeyOfTheOrdersEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	o, _, err := f.svc.Place(ctx, orders.PlaceRequest{CustomerID: "c-1", Lines: validLines})
	require.NoError(t, err)
	_, err = f.svc.Cancel(ctx, o.ID)
	require.NoError(t, err)
	other, _, err := f.svc.Place(ctx, orders.PlaceRequest{CustomerID: "c-2", Lines: validLines})
	require.NoError(t, err)

	key, err := f.svc.EventKey(ctx, o.ID)
	require.NoError(t, err)
	rows, err := f.pool.Query(ctx, `SELECT type FROM outbox_events WHERE ordering_key = $1 ORDER BY id`, key)
	require.NoError(t, err)
	var types []string
	for rows.Next() {
		var typ string
		require.NoError(t, rows.Scan(&typ))
		types = append(types, typ)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{orders.EventPlaced, orders.EventCancelled}, types, "the order's events, and no other order's")
	otherKey, err := f.svc.EventKey(ctx, other.ID)
	require.NoError(t, err)
	require.NotEqual(t, key, otherKey)

	_, err = f.svc.EventKey(ctx, uuid.New())
	require.ErrorIs(t, err, orders.ErrNotFound)
}
