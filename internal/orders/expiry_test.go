package orders_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/orders"
)

// An idempotency key dedupes for its time to live, then expires: the
// expiry clears the keys of orders placed before the TTL (the orders stay),
// after which the same key places a new order, while younger keys still
// replay their order.
func TestIdempotencyKeysExpireAfterTheirTTL(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	old, _ := f.place(t, validBody, "Idempotency-Key", "k-old")
	young, _ := f.place(t, validBody, "Idempotency-Key", "k-young")
	_, err := f.pool.Exec(ctx, `UPDATE orders SET created_at = now() - interval '25 hours' WHERE id = $1`, old.ID)
	require.NoError(t, err)

	n, err := f.svc.ExpireIdempotencyKeys(ctx, orders.DefaultIdempotencyTTL)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only the key older than the TTL is cleared")
	var keys []*string
	rows, err := f.pool.Query(ctx, `SELECT idempotency_key FROM orders ORDER BY created_at`)
	require.NoError(t, err)
	for rows.Next() {
		var k *string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	require.Len(t, keys, 2, "expiry clears keys, never orders")
	require.Nil(t, keys[0], "the old order's key is gone")
	require.Equal(t, "k-young", *keys[1])

	again, res := f.place(t, validBody, "Idempotency-Key", "k-old")
	require.Empty(t, res.header.Get("Idempotent-Replayed"), "an expired key places a new order")
	require.NotEqual(t, old.ID, again.ID)
	replay, res := f.place(t, validBody, "Idempotency-Key", "k-young")
	require.Equal(t, "true", res.header.Get("Idempotent-Replayed"), "a key within its TTL still dedupes")
	require.Equal(t, young.ID, replay.ID)
	require.Equal(t, counts{orders: 3, lines: 6, outbox: 3}, f.counts(t))

	_, err = f.svc.ExpireIdempotencyKeys(ctx, 0)
	require.Error(t, err, "a TTL of zero would clear every key")
}
