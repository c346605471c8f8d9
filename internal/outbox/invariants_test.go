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

// The attempts summed by minute (what the ops page reads) hold every
// attempt of the history: the statements that write attempts add them to
// their minute's sums, and pruning the history leaves the sums be. The view
// outbox_attempt_minutes_inconsistent names a minute whose sums fall
// short, so every test's database is checked for it, whatever the relay
// did in it; outbox_attempt_minutes_recount counts them again from the
// history.
func TestAttemptSumsHoldEveryAttemptOfTheHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)

	var msg, dest uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox_messages (event_id, type, destination)
VALUES (gen_random_uuid(), 'order.placed', gen_random_uuid()) RETURNING id, destination`).Scan(&msg, &dest))
	// Attempts written without their sums: two refused in one minute, then
	// one delivered in 8 ms two minutes later.
	_, err := pool.Exec(ctx, `WITH t AS (SELECT date_trunc('minute', now()) - interval '2 minutes' AS m)
INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
SELECT $1::uuid, 1, 'retry', m + interval '10 s', m + interval '11 s', 503 FROM t
UNION ALL SELECT $1::uuid, 2, 'retry', m + interval '20 s', m + interval '20.2 s', 503 FROM t
UNION ALL SELECT $1::uuid, 3, 'delivered', m + interval '2 minutes', m + interval '2 minutes 8 ms', 204 FROM t`, msg)
	require.NoError(t, err)
	lines, err := dbtest.Inconsistencies(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	require.Len(t, lines, 2, "both minutes fall short: %v", lines)
	for _, l := range lines {
		require.Contains(t, l, "outbox_attempt_minutes_inconsistent")
		require.Contains(t, l, `"summed": 0`)
	}

	_, err = pool.Exec(ctx, `SELECT outbox_attempt_minutes_recount(now() - interval '1 hour')`)
	require.NoError(t, err)
	lines, err = dbtest.Inconsistencies(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	require.Empty(t, lines)
	type sum struct {
		Outcome      string
		LeMS         int
		Attempts     int64
		MinMS, MaxMS float64
	}
	rows, err := pool.Query(ctx, `SELECT outcome, le_ms, attempts, min_ms, max_ms
FROM outbox_attempt_minutes WHERE destination = $1 ORDER BY minute`, dest)
	require.NoError(t, err)
	sums, err := pgx.CollectRows(rows, pgx.RowToStructByPos[sum])
	require.NoError(t, err)
	require.Equal(t, []sum{
		{Outcome: "retry", LeMS: 0, Attempts: 2, MinMS: 200, MaxMS: 1000},
		{Outcome: "delivered", LeMS: 10, Attempts: 1, MinMS: 8, MaxMS: 8},
	}, sums, "the refusals in their minute, in no bucket; the delivery in the bucket up to 10 ms")

	// Pruning the history leaves the sums, and the view stays empty.
	_, err = pool.Exec(ctx, `DELETE FROM outbox_messages WHERE id = $1`, msg)
	require.NoError(t, err)
	lines, err = dbtest.Inconsistencies(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	require.Empty(t, lines)
	var kept int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(attempts) FROM outbox_attempt_minutes WHERE destination = $1`, dest).Scan(&kept))
	require.Equal(t, int64(3), kept, "the three summed attempts outlive their history")
}
