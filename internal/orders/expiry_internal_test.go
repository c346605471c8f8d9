package orders

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/orders/internal/ordersdb"
)

// Each statement of the expiry clears at most one batch, oldest first, and
// the loop goes on until no expired key is left.
func TestIdempotencyExpiryRunsInBoundedBatches(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO orders (id, customer_id, status, total_cents, idempotency_key, request_hash, created_at)
		SELECT gen_random_uuid(), 'c', 'placed', 1, 'k-' || g, '\x00', now() - interval '2 days' - g * interval '1 second'
		FROM generate_series(1, 25) g;
		INSERT INTO orders (id, customer_id, status, total_cents, idempotency_key, request_hash)
		VALUES (gen_random_uuid(), 'c', 'placed', 1, 'k-new', '\x00')`)
	require.NoError(t, err)
	ttl := 24 * time.Hour

	n, err := ordersdb.New(pool).OrderIdempotencyKeysExpire(ctx, ttl.Seconds(), 10)
	require.NoError(t, err)
	require.EqualValues(t, 10, n, "one statement clears one batch")
	var oldestLeft string
	require.NoError(t, pool.QueryRow(ctx, `SELECT idempotency_key FROM orders WHERE idempotency_key IS NOT NULL
		ORDER BY created_at LIMIT 1`).Scan(&oldestLeft))
	require.Equal(t, "k-15", oldestLeft, "the oldest keys go first")

	svc := NewService(pool, slog.New(slog.DiscardHandler))
	n, err = svc.expireIdempotencyKeys(ctx, ttl, 10)
	require.NoError(t, err)
	require.EqualValues(t, 15, n, "the loop clears the rest, batch after batch")
	var left []string
	rows, err := pool.Query(ctx, `SELECT idempotency_key FROM orders WHERE idempotency_key IS NOT NULL`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		left = append(left, k)
	}
	require.Equal(t, []string{"k-new"}, left, "a key within its TTL stays")

	// The batch is found on the partial index, not by reading every order.
	_, err = pool.Exec(ctx, `
		INSERT INTO orders (id, customer_id, status, total_cents, created_at)
		SELECT gen_random_uuid(), 'c', 'placed', 1, now() - interval '3 days' FROM generate_series(1, 20000);
		ANALYZE orders`)
	require.NoError(t, err)
	rows, err = pool.Query(ctx, `EXPLAIN UPDATE orders SET idempotency_key = NULL, request_hash = NULL
		WHERE id IN (SELECT o.id FROM orders o WHERE o.idempotency_key IS NOT NULL AND o.created_at < now() - make_interval(secs => $1::float8)
		ORDER BY o.created_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, ttl.Seconds(), 1000)
	require.NoError(t, err)
	var lines []string
	for rows.Next() {
		var l string
		require.NoError(t, rows.Scan(&l))
		lines = append(lines, l)
	}
	require.NoError(t, rows.Err())
	require.Contains(t, strings.Join(lines, "\n"), "orders_idempotency_created_idx", "the expiry walks the keys' index")
}
