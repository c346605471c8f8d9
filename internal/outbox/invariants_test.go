package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
)

// outbox_messages keeps its invariants in its queries, not in CHECK
// constraints (they cost the order transaction more than its row), and
// states them in the view outbox_messages_inconsistent, which every test
// database must leave empty. The view must name each broken invariant and
// no consistent row, or that check proves nothing.
func TestInconsistentViewNamesEveryBrokenInvariantAndNoConsistentRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)

	// Each row: its columns' SQL, and the invariant it breaks ("" for none).
	rows := []struct{ set, breaks string }{
		{"status = 'pending'", ""},
		{"status = 'pending', parked = true, attempts = 2, attempts_before = 1", ""},
		{"status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now()", ""},
		{"status = 'delivered', delivered_at = now()", ""},
		{"status = 'failed', failed_at = now()", ""},
		{"status = 'discarded', discarded_at = now()", ""},
		// A failed message retried or skipped keeps the time it failed.
		{"status = 'pending', attempts_before = 3, failed_at = now()", ""},
		{"status = 'discarded', discarded_at = now(), failed_at = now()", ""},

		{"status = 'sent'", "status is one of pending, claimed, delivered, failed, discarded"},
		{"status = 'pending', attempts = -1", "attempts and attempts_before are not negative"},
		{"status = 'pending', attempts_before = -1", "attempts and attempts_before are not negative"},
		{"status = 'claimed', claimed_at = now()", "a claimed message, and only one, has a claim token and time"},
		{"status = 'pending', claim_token = gen_random_uuid(), claimed_at = now()", "a claimed message, and only one, has a claim token and time"},
		{"status = 'delivered'", "a delivered message, and only one, has delivered_at"},
		{"status = 'pending', delivered_at = now()", "a delivered message, and only one, has delivered_at"},
		{"status = 'discarded'", "a discarded message, and only one, has discarded_at"},
		{"status = 'failed'", "a failed message has failed_at"},
		{"status = 'failed', failed_at = now(), parked = true", "only a pending message is parked"},
	}
	want := map[uuid.UUID]string{}
	var ids []uuid.UUID
	for _, r := range rows {
		// Each row is written as a pending delivery, as EventEnqueue writes
		// it, then given its state: no constraint refuses any of them.
		var id uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox_messages (event_id, type, destination)
VALUES (gen_random_uuid(), 'order.placed', gen_random_uuid()) RETURNING id`).Scan(&id))
		_, err := pool.Exec(ctx, "UPDATE outbox_messages SET "+r.set+" WHERE id = $1", id)
		require.NoError(t, err, r.set)
		ids = append(ids, id)
		if r.breaks != "" {
			want[id] = r.breaks
		}
	}

	got := map[uuid.UUID]string{}
	found, err := pool.Query(ctx, "SELECT id, invariant FROM outbox_messages_inconsistent")
	require.NoError(t, err)
	var id uuid.UUID
	var invariant string
	_, err = pgx.ForEachRow(found, []any{&id, &invariant}, func() error {
		got[id] = invariant
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, want, got, "the view lists exactly the rows that break an invariant, each with the invariant it breaks")

	// This is what fails a test that leaves such a row behind.
	lines, err := dbtest.Inconsistencies(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	require.Len(t, lines, min(len(want), 10), "dbtest reports the view's rows, at most 10 of it")

	// Leave the database consistent, as every test must.
	_, err = pool.Exec(ctx, "DELETE FROM outbox_messages WHERE id = ANY ($1)", ids)
	require.NoError(t, err)
}
