package outbox_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/stretchr/testify/require"
)

// Failed messages wait for a person for the failed retention, then the prune
// job deletes them with their attempt history, in batches, and then their
// events. Failed messages younger than that, and pending and claimed ones
// however old, are kept with their attempts.
func TestPruneJobDeletesFailedRowsPastTheFailedRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	outboxtest.PartitionsSince(t, f.pool, time.Now().Add(-41*24*time.Hour))
	// Events of 40 days ago: 5,010 failed 31 days ago (more than one prune
	// batch), and one each failed yesterday, pending and claimed; every
	// message with two attempts.
	_, err := f.pool.Exec(ctx, `
		CREATE TEMP TABLE seed (keep text, status text, failed_at timestamptz, n integer);
		INSERT INTO seed VALUES
			(NULL, 'failed', now() - interval '31 days', 5010),
			('failed yesterday', 'failed', now() - interval '1 day', 1),
			('pending', 'pending', NULL, 1),
			('claimed', 'claimed', NULL, 1);
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(now() - interval '40 days' + g * interval '1 microsecond'), 'order.placed',
			       json_build_object('keep', s.keep, 'status', s.status), now() - interval '40 days'
			FROM seed s, generate_series(1, s.n) g
			RETURNING id, payload->>'status' AS status, payload->>'keep' AS keep, created_at)
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, failed_at,
		                             claim_token, claimed_at, created_at, next_attempt_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', e.id, ev.status, 2, s.failed_at,
		       CASE WHEN ev.status = 'claimed' THEN gen_random_uuid() END,
		       CASE WHEN ev.status = 'claimed' THEN now() END,
		       ev.created_at, ev.created_at
		FROM ev JOIN seed s ON s.status = ev.status AND s.keep IS NOT DISTINCT FROM ev.keep, webhook_endpoints e;
		INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, error)
		SELECT m.id, a, CASE WHEN a = 2 AND m.status = 'failed' THEN 'failed' ELSE 'retry' END,
		       COALESCE(m.failed_at, m.created_at), COALESCE(m.failed_at, m.created_at), 'connection refused'
		FROM outbox_messages m, generate_series(1, 2) a;
		SELECT outbox_attempt_minutes_recount(now() - interval '2 days');`)
	require.NoError(t, err)

	cfg := fastConfig()
	cfg.FailedRetention = 30 * 24 * time.Hour
	f.startRelay(t, cfg, nil)

	count := func(query string) int {
		var n int
		require.NoError(t, f.pool.QueryRow(ctx, query).Scan(&n))
		return n
	}
	within(t, 30*time.Second, func() bool {
		return count("SELECT count(*) FROM outbox_events") == 3
	}, "the failed messages past the retention, then their events, are pruned")
	rows, err := f.pool.Query(ctx, `SELECT ev.payload->>'keep' FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id ORDER BY 1`)
	require.NoError(t, err)
	kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"claimed", "failed yesterday", "pending"}, kept,
		"only failed messages past the failed retention are deleted")
	require.Equal(t, 6, count("SELECT count(*) FROM outbox_attempts WHERE attempt <= 2"),
		"the pruned messages' attempts went with them; the kept ones keep theirs")
}

// A failed message records when it failed, which is what the failed
// retention counts from; a requeue and a new failure start it again.
func TestFailedMessagesRecordWhenTheyFailed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	rc.respond = func(*http.Request, int) int { return http.StatusBadRequest }
	f.endpoint(t, rc, "order.placed")
	f.enqueue(t, "order.placed", map[string]int{"n": 1})
	cfg := fastConfig()
	cfg.MaxAttempts = 1
	f.startRelay(t, cfg, nil)
	var failedAt *time.Time
	within(t, 10*time.Second, func() bool {
		err := f.pool.QueryRow(ctx, `SELECT failed_at FROM outbox_messages WHERE status = 'failed'`).Scan(&failedAt)
		return err == nil
	}, "the message fails")
	require.NotNil(t, failedAt, "a failed message has its failed_at")
	require.WithinDuration(t, time.Now(), *failedAt, 10*time.Second)
}

// Chores run on the relay's River leader, at start and then every interval.
func TestRelayRunsChores(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var runs atomic.Int32
	cfg := fastConfig()
	cfg.Chores = []relay.Chore{{Name: "test_chore", Interval: time.Hour, Run: func(context.Context) error {
		runs.Add(1)
		return nil
	}}}
	f.startRelay(t, cfg, nil)
	within(t, 20*time.Second, func() bool { return runs.Load() == 1 }, "the chore runs when the relay starts")

	for _, bad := range [][]relay.Chore{
		{{Name: "", Run: func(context.Context) error { return nil }}},
		{{Name: "x"}},
		{{Name: "x", Run: func(context.Context) error { return nil }}, {Name: "x", Run: func(context.Context) error { return errors.New("") }}},
	} {
		var fe *relay.FieldError
		require.ErrorAs(t, relay.Config{Chores: bad}.Validate(), &fe, "a chore without a name or Run, or named twice, is refused")
		require.Equal(t, "Chores", fe.Field)
	}
}
