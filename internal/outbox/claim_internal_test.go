package outbox

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Concurrent claimers partition the rows: each row is claimed by exactly
// one of them, and none is missed. This is what makes several relays safe.
func TestClaimPartitionsRowsBetweenConcurrentClaimers(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO outbox_messages (type, destination, payload)
		SELECT 'order.placed', gen_random_uuid(), '{}' FROM generate_series(1, 5000)`)
	require.NoError(t, err)

	const claimers = 4
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	for range claimers {
		wg.Go(func() {
			for {
				var rows []outboxdb.MessageClaimRow
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
					rows, err = outboxdb.New(tx).MessageClaim(ctx, uuid.New(), 50)
					return err
				})
				if !assertNoErr(t, err) || len(rows) == 0 {
					return
				}
				mu.Lock()
				for _, r := range rows {
					seen[r.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, 5000, "every row claimed")
	for id, n := range seen {
		require.Equal(t, 1, n, "row %s claimed more than once", id)
	}
}

func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func TestBackoffGrowsWithJitterUpToTheCap(t *testing.T) {
	t.Parallel()
	cfg := RelayConfig{BackoffBase: 100_000_000, BackoffMax: 1_000_000_000}.withDefaults() // 100ms, 1s
	for attempt, want := range map[int]int64{1: 100_000_000, 2: 200_000_000, 3: 400_000_000, 4: 800_000_000, 5: 1_000_000_000, 30: 1_000_000_000} {
		for range 50 {
			d := int64(cfg.backoff(attempt))
			require.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, want, "attempt %d", attempt)
		}
	}
}
