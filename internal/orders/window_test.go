package orders_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/orders"
)

// EventWindow points at exactly the order's events: their key is the order
// id, and every event of the order (its placement and its cancellation)
// was written within the window it gives.
func TestEventWindowCoversTheOrdersEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	o, _, err := f.svc.Place(ctx, orders.PlaceRequest{CustomerID: "c-1", Lines: validLines})
	require.NoError(t, err)
	_, err = f.svc.Cancel(ctx, o.ID)
	require.NoError(t, err)

	key, from, to, err := f.svc.EventWindow(ctx, o.ID)
	require.NoError(t, err)
	require.Equal(t, o.ID.String(), key)
	rows, err := f.pool.Query(ctx, `SELECT type, ordering_key, created_at FROM outbox_events ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var types []string
	for rows.Next() {
		var typ, k string
		var at time.Time
		require.NoError(t, rows.Scan(&typ, &k, &at))
		require.Equal(t, key, k)
		require.True(t, !at.Before(from) && at.Before(to), "%s at %s is outside [%s, %s)", typ, at, from, to)
		types = append(types, typ)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{orders.EventPlaced, orders.EventCancelled}, types)

	_, _, _, err = f.svc.EventWindow(ctx, uuid.New())
	require.ErrorIs(t, err, orders.ErrNotFound)
}
