package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Two replays of one endpoint at once make one copy of an event, not two:
// the second waits for the first to commit, and then sees its copy
// waiting. Each alone checks for a waiting copy, but neither can see the
// other's before it commits.
func TestConcurrentReplaysOfOneEndpointMakeOneCopy(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	from := time.Now()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = Enqueue(ctx, tx, Event{Type: "order.placed", Data: 1})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	ep := testEndpoint(t, pool, nil) // subscribed after the event: nothing waits for it yet
	r := Replay{From: from, To: time.Now().Add(time.Second)}
	// The first replay copies the event and has not committed yet.
	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx) //nolint:errcheck
	res, err := replayBatch(ctx, first, ep, r)
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)

	type result struct {
		res ReplayResult
		err error
	}
	second := make(chan result, 1)
	go func() {
		res, err := admin.ReplayEvents(ctx, ep, r)
		second <- result{res, err}
	}()
	// The second either waits on a lock (until the first commits) or, had
	// it nothing to wait on, ends on its own.
	var ended *result
	require.Eventually(t, func() bool {
		select {
		case r := <-second:
			ended = &r
			return true
		default:
		}
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database())`).Scan(&waiting)
		return assert.NoError(t, err) && waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, first.Commit(ctx))
	if ended == nil {
		r := <-second
		ended = &r
	}
	require.NoError(t, ended.err)
	require.Equal(t, ReplayResult{Read: 1, Replayed: 0}, ended.res, "the second replay finds the first one's copy waiting")
	var copies int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending'`, ep).Scan(&copies))
	require.Equal(t, 1, copies, "one waiting copy of the event for the endpoint")
}

// Discarding what waits for an endpoint settles all of it, however many
// batches that takes, parked messages too, and leaves failed ones waiting
// for a person.
func TestDiscardWaitingSettlesEveryBatch(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	ep := testEndpoint(t, pool, nil)
	const n = 2*discardBatch + 7
	Seed(t, pool, ep, n, "")
	keyed := Seed(t, pool, ep, 3, "order-1")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET parked = true WHERE id = ANY ($1)`, keyed[1:])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', attempts = 1, failed_at = now() WHERE id = $1`, keyed[0])
	require.NoError(t, err)

	// A budget spent during the first batch: that batch, then a stop.
	discarded, finished, err := admin.DiscardWaiting(ctx, ep, time.Nanosecond)
	require.NoError(t, err)
	require.False(t, finished)
	require.EqualValues(t, discardBatch, discarded, "one whole batch, not a batch cut short")
	more, finished, err := admin.DiscardWaiting(ctx, ep, 0)
	require.NoError(t, err)
	require.True(t, finished)
	require.EqualValues(t, n+2, discarded+more, "every pending message, parked ones too")
	var pending, failed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed')
		FROM outbox_messages WHERE destination = $1`, ep).Scan(&pending, &failed))
	require.Zero(t, pending)
	require.Equal(t, 1, failed, "a failed message waits for a retry or a skip")
}

// Deleting an endpoint takes row locks in the relay's order, its messages
// before the endpoint: a relay recording a claimed message of it and then
// settling the destination's lease (both in one transaction, as a deliver
// job ends) finishes, and so does the deletion, with no deadlock.
func TestDeleteEndpointBesideAJobEndingDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	ep := testEndpoint(t, pool, nil)
	ids := Seed(t, pool, ep, 1, "")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now() WHERE id = $1`, ids[0])
	require.NoError(t, err)

	// The job ending: its outcome recorded first.
	job, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer job.Rollback(ctx) //nolint:errcheck
	_, err = job.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(), claim_token = NULL, claimed_at = NULL WHERE id = $1`, ids[0])
	require.NoError(t, err)

	deleted := deleteAside(admin, ep)
	waitForALockWait(t, pool, "the deletion waits for the message the job holds")

	// Then the lease settled: the endpoint's row, which a deletion that
	// had locked it first would hold while waiting for the message.
	_, err = job.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE`, ep)
	require.NoError(t, err, "the job's lock on the endpoint is not a deadlock")
	require.NoError(t, job.Commit(ctx))
	require.NoError(t, <-deleted)

	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE id = $1`, ids[0]).Scan(&status))
	require.Equal(t, "delivered", status, "what the job recorded stands")
}

// A destination's recovery, as its probe gets an answer, takes its row
// locks in the same order as a deletion, its messages before the endpoint:
// the deletion, having settled the messages, deletes the endpoint while the
// recovery waits for a message, and both finish. The recovery locked the
// endpoint first, and one of the two was aborted as a deadlock (the
// deletion answering 500, or the recovery unrecorded).
func TestDeleteEndpointBesideARecoveryDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	Seed(t, pool, dest, 1, "")
	var logs strings.Builder
	r := defaultRelay(t, pool, slog.New(slog.NewTextHandler(&logs, nil)))
	// A retry the outage pushed back: what the recovery brings forward.
	rows, err := claimMessages(ctx, pool, outboxdb.MessageClaimParams{ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 1})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	s := &session{r: r, dest: dest, token: lease}
	now := time.Now()
	unreachable := r.judge(sent{row: rows[0], started: now, finished: now, res: Result{Err: errors.New("connection refused")}})
	_, err = outboxdb.New(pool).MessagesRecordOutcomes(ctx, s.recordParams([]outcome{unreachable}))
	require.NoError(t, err)

	// The deletion: its messages settled first.
	del, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer del.Rollback(ctx) //nolint:errcheck
	n, err := outboxdb.New(del).MessagesDiscardForDestination(ctx, "endpoint deleted", dest, discardBatch)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	recovered := make(chan struct{})
	go func() {
		defer close(recovered)
		s.recovered(ctx)
	}()
	waitForALockWait(t, pool, "the recovery waits for the message the deletion holds")

	deleted, err := outboxdb.New(del).EndpointDelete(ctx, dest)
	require.NoError(t, err, "the deletion's lock on the endpoint is not a deadlock")
	require.EqualValues(t, 1, deleted)
	require.NoError(t, del.Commit(ctx))
	<-recovered
	require.NotContains(t, logs.String(), "recording destination recovered", "the recovery's write did not fail")
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE destination = $1`, dest).Scan(&status))
	require.Equal(t, StatusDiscarded, status, "what the deletion settled stands")
}

// A window of time bounds what Messages reads, not only what it returns:
// messages are listed in event order, their ids begin with the event's
// time, and From and To are a range of the primary key. Filtered on
// created_at instead, a search for a quiet endpoint's messages of one hour
// walked the whole history newest first, looking for 50 rows that were not
// there (1.7 s with 1.5 million rows).
func TestMessagesReadsOnlyTheWindow(t *testing.T) {
	t.Parallel()
	pool, trace := tracedPool(t)
	ctx := context.Background()
	busy, quiet := testEndpoint(t, pool, nil), testEndpoint(t, pool, nil)
	// Two days of delivered history for the busy endpoint, one event every
	// 0.864 s, and 5 events of the quiet one 3 hours ago.
	history := func(dest uuid.UUID, n int, first, step string) {
		_, err := pool.Exec(ctx, `
			WITH ev AS (
				INSERT INTO outbox_events (id, type, payload, created_at)
				SELECT outbox_uuid_v7_at(s.at), 'order.placed', '{"total":1}', s.at
				FROM (SELECT now() - $3::interval - g * $4::interval AS at FROM generate_series(1, $2::int) g) s
				RETURNING id, type, created_at
			)
			INSERT INTO outbox_messages (id, event_id, type, destination, status, delivered_at, next_attempt_at, created_at)
			SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, $1, 'delivered', ev.created_at, ev.created_at, ev.created_at
			FROM ev`, dest, n, first, step)
		require.NoError(t, err)
	}
	history(busy, 200_000, "0", "864 milliseconds")
	history(quiet, 5, "3 hours", "1 second")
	_, err := pool.Exec(ctx, `ANALYZE outbox_messages`)
	require.NoError(t, err)
	var pages int
	require.NoError(t, pool.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE relname = 'outbox_messages'`).Scan(&pages))

	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	from, to := time.Now().Add(-4*time.Hour), time.Now().Add(-2*time.Hour)
	trace.mu.Lock()
	trace.last = map[string][]any{}
	trace.mu.Unlock()
	msgs, next, err := admin.Messages(ctx, MessageFilter{Destination: &quiet, CreatedFrom: &from, CreatedTo: &to})
	require.NoError(t, err)
	require.Len(t, msgs, 5)
	require.Nil(t, next)
	trace.mu.Lock()
	require.Len(t, trace.last, 1, "one statement")
	var sql string
	var args []any
	for sql, args = range trace.last {
	}
	trace.last = nil
	trace.mu.Unlock()
	var plan []string
	require.ErrorIs(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		plan = planLines(t, tx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		return errRollback
	}), errRollback)
	t.Logf("%s", strings.Join(plan, "\n"))
	var hit, read int
	for _, l := range plan {
		if _, after, ok := strings.Cut(l, "Buffers: shared hit="); ok {
			// The first is the root's: the statement's whole reading.
			fmt.Sscanf(after, "%d read=%d", &hit, &read)
			break
		}
	}
	require.Positive(t, hit+read)
	require.Less(t, hit+read, pages/5,
		"a window of 2 hours reads about that much of the 48 hours of history (%d pages), not all of it", pages)
}

// A job's end and an endpoint's deletion each lock several of the
// destination's messages, in their own order: here the deletion holds the
// message the job releases (never sent) and waits for the one it recorded.
// PostgreSQL aborts the job's transaction to break the deadlock; run again,
// it finds the deletion's settlement and finishes. The job's end failed,
// and its writes waited for the next heartbeats.
//
// On a loaded machine PostgreSQL may abort the deletion instead (see
// TestDeleteEndpointBesideAJobEndOutlastsADeadlock): the test sets the
// scene again, a few times at most, until the job is the one.
func TestJobEndBesideADeletionOutlastsADeadlock(t *testing.T) {
	t.Parallel()
	untilTheSideIsAborted(t, "the job", jobEndAbortedAndRetried)
}

// jobEndAbortedAndRetried produces the cycle of
// TestJobEndBesideADeletionOutlastsADeadlock on a database of its own and
// checks its outcome; false when PostgreSQL aborted the deletion instead.
func jobEndAbortedAndRetried(t *testing.T) bool {
	pool, dest, lease := leased(t)
	ctx := context.Background()
	Seed(t, pool, dest, 2, "")
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	// A River client, not started, for a job's end that queues the next
	// deliver job (when the deletion is the side aborted).
	client, err := r.newRiverClient()
	require.NoError(t, err)
	r.client = client
	rows, err := claimMessages(ctx, pool, outboxdb.MessageClaimParams{ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 2})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	s := &session{r: r, dest: dest, token: lease}
	now := time.Now()
	s.outcomes = []outcome{r.judge(sent{row: rows[0], started: now, finished: now, res: Result{StatusCode: http.StatusNoContent}})}
	s.unsent = []uuid.UUID{rows[1].ID}

	// The deletion holds the unsent message.
	del, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer del.Rollback(ctx) //nolint:errcheck
	_, err = del.Exec(ctx, `SELECT 1 FROM outbox_messages WHERE id = $1 FOR UPDATE`, rows[1].ID)
	require.NoError(t, err)

	settled := make(chan error, 1)
	go func() {
		settled <- inTx(ctx, pool, func(tx pgx.Tx) error { return s.settleWrite(ctx, tx, HealthHealthy, nil, nil) })
	}()
	waitForALockWait(t, pool, "the job's end waits for the message the deletion holds")

	// The deletion reaches the message the job recorded: the cycle.
	n, err := outboxdb.New(del).MessagesDiscardForDestination(ctx, "endpoint deleted", dest, discardBatch)
	if isDeadlock(err) {
		t.Log("PostgreSQL aborted the deletion, not the job: setting the scene again")
		require.NoError(t, del.Rollback(ctx))
		require.NoError(t, <-settled, "the job's end finishes once the deletion is aborted")
		return false
	}
	require.NoError(t, err, "the deletion goes on once the job's transaction is aborted")
	require.EqualValues(t, 2, n)
	require.NoError(t, del.Commit(ctx))
	require.NoError(t, <-settled, "the job's end, run again, finishes")

	var discarded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'discarded'`, dest).Scan(&discarded))
	require.Equal(t, 2, discarded, "what the deletion settled stands")
	return true
}

// The same cycle the other way round: the deletion waits first, so it is
// the one PostgreSQL aborts, and DeleteEndpoint runs it again rather than
// answering 500. Here the job holds the message it recorded and then
// releases one the deletion locked meanwhile.
//
// PostgreSQL aborts the side whose deadlock_timeout ends first with the
// cycle closed. On a loaded machine the job's release can start waiting
// after the deletion's timer has already looked and found no cycle, and
// then the job is the one aborted (the case of
// TestJobEndBesideADeletionOutlastsADeadlock): the test sets the scene
// again, a few times at most, until the deletion is the one.
func TestDeleteEndpointBesideAJobEndOutlastsADeadlock(t *testing.T) {
	t.Parallel()
	untilTheSideIsAborted(t, "the deletion", deletionAbortedAndRetried)
}

// untilTheSideIsAborted sets a deadlock's scene again, 5 times at most,
// until PostgreSQL aborts the side the test is about (scene reports false
// when it aborted the other).
func untilTheSideIsAborted(t *testing.T, side string, scene func(*testing.T) bool) {
	t.Helper()
	for try := 1; !scene(t); try++ {
		require.Less(t, try, 5, "the other side, not %s, was aborted %d times in a row", side, try)
	}
}

// deletionAbortedAndRetried produces the cycle of
// TestDeleteEndpointBesideAJobEndOutlastsADeadlock on a database of its
// own and checks its outcome; false when PostgreSQL aborted the job
// instead of the deletion.
func deletionAbortedAndRetried(t *testing.T) bool {
	pool, dest, lease := leased(t)
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	Seed(t, pool, dest, 2, "")
	rows, err := claimMessages(ctx, pool, outboxdb.MessageClaimParams{ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 2})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	slices.SortFunc(rows, func(a, b outboxdb.MessageClaimRow) int { return strings.Compare(a.ID.String(), b.ID.String()) })

	// The job records the later message.
	job, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer job.Rollback(ctx) //nolint:errcheck
	_, err = job.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', attempts = 1, delivered_at = now(),
		claim_token = NULL, claimed_at = NULL, claimed_by = NULL WHERE id = $1`, rows[1].ID)
	require.NoError(t, err)

	deleted := deleteAside(admin, dest)
	waitForALockWait(t, pool, "the deletion, holding the earlier message, waits for the later")

	// The job releases the earlier message: the cycle.
	_, err = outboxdb.New(job).MessagesRelease(ctx, []uuid.UUID{rows[0].ID}, lease)
	if isDeadlock(err) {
		t.Log("PostgreSQL aborted the job, not the deletion: setting the scene again")
		require.NoError(t, job.Rollback(ctx))
		require.NoError(t, <-deleted, "the deletion finishes once the job is aborted")
		return false
	}
	require.NoError(t, err, "the job goes on once the deletion's transaction is aborted")
	require.NoError(t, job.Commit(ctx))
	require.NoError(t, <-deleted, "the deletion, run again, finishes")

	var statuses []string
	r, err := pool.Query(ctx, `SELECT status FROM outbox_messages WHERE destination = $1 ORDER BY id`, dest)
	require.NoError(t, err)
	statuses, err = pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{StatusDiscarded, StatusDelivered}, statuses, "the released message discarded, the delivered one kept")
	return true
}

// waitForALockWait waits until a session of the test's database waits for
// a lock.
func waitForALockWait(t *testing.T, pool *pgxpool.Pool, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, msg)
}

// A paused endpoint keeps when and why it was paused: changing its URL or
// types, rotating its secret or pausing it again moves neither. StateSince
// was the endpoint's last update, and a person's pause of an endpoint a
// 410 had paused replaced the receiver's reason with theirs.
func TestAPausedEndpointKeepsWhenAndWhyItWasPaused(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	_, err := outboxdb.New(pool).DestinationSettle(ctx, outboxdb.DestinationSettleParams{
		ID: dest, LeaseToken: lease, Health: HealthHealthy, Gone: true})
	require.NoError(t, err)
	gone, err := admin.Endpoint(ctx, dest)
	require.NoError(t, err)
	require.Equal(t, HealthPaused, gone.State)
	require.Equal(t, "receiver answered 410 Gone", gone.StateReason)
	require.NotNil(t, gone.StateSince)

	_, err = admin.UpdateEndpoint(ctx, dest, EndpointChange{EventTypes: []string{"order.placed", "order.cancelled"}})
	require.NoError(t, err)
	_, err = admin.RotateSecret(ctx, dest, time.Hour)
	require.NoError(t, err)
	_, err = admin.SetEndpointEnabled(ctx, dest, false)
	require.NoError(t, err)
	still, err := admin.Endpoint(ctx, dest)
	require.NoError(t, err)
	require.Equal(t, HealthPaused, still.State)
	require.Equal(t, gone.StateSince, still.StateSince, "paused since the 410")
	require.Equal(t, gone.StateReason, still.StateReason, "paused because of the 410")

	// Resumed, then paused by a person: a new pause, with its own time and
	// reason.
	_, err = admin.SetEndpointEnabled(ctx, dest, true)
	require.NoError(t, err)
	again, err := admin.SetEndpointEnabled(ctx, dest, false)
	require.NoError(t, err)
	require.Equal(t, "disabled by an operator", again.StateReason)
	require.True(t, again.StateSince.After(*gone.StateSince), "%v after %v", again.StateSince, gone.StateSince)
}

// Enabling an endpoint that is enabled and healthy leaves a receiver's
// Retry-After in force; only an endpoint backing off is probed at once.
// Before, the wait the receiver asked for was cut short.
func TestEnablingAThrottledEndpointKeepsItsRetryAfter(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	until := time.Now().Add(time.Hour)
	_, err := outboxdb.New(pool).DestinationSettle(ctx, outboxdb.DestinationSettleParams{
		ID: dest, LeaseToken: lease, Health: HealthHealthy, BackoffUntil: &until})
	require.NoError(t, err)
	ep, err := admin.SetEndpointEnabled(ctx, dest, true)
	require.NoError(t, err)
	require.NotNil(t, ep.ThrottledUntil, "still throttled")
	require.WithinDuration(t, until, *ep.ThrottledUntil, time.Millisecond)
}

// How long a destination backed off is measured on the database's clock,
// which wrote when it began: a worker whose clock is an hour behind says
// 10s, not an hour less.
func TestARecoverySaysHowLongItBackedOffOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	var logs strings.Builder
	r := defaultRelay(t, pool, slog.New(slog.NewTextHandler(&logs, nil)))
	r.skew.Store(int64(time.Hour)) // the database's clock is an hour ahead
	began := r.dbNow().Add(-10 * time.Second)
	s := &session{r: r, dest: dest, token: lease, ep: outboxdb.DestinationLeaseRow{HealthChangedAt: &began}}
	s.announceRecovered(context.Background())
	require.Contains(t, logs.String(), "backed_off_for=10s")
}

// deleteAside deletes an endpoint in the background and reports the end.
func deleteAside(admin *Admin, ep uuid.UUID) <-chan error {
	deleted := make(chan error, 1)
	go func() {
		_, err := admin.DeleteEndpoint(context.Background(), ep)
		deleted <- err
	}()
	return deleted
}

// defaultRelay is a relay at the default settings delivering webhooks to
// any address, local ones included, that is not started.
func defaultRelay(t *testing.T, pool *pgxpool.Pool, logger *slog.Logger) *Relay {
	t.Helper()
	r, err := NewRelay(pool, RelayConfig{}, &HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}, logger, nil)
	require.NoError(t, err)
	return r
}

// A deletion goes on discarding after a batch that came back short only
// because the relay delivered one of its messages meanwhile (the batch's
// re-check keeps it delivered): it stopped there, with the rest of the
// endpoint's failed messages left failed, which nothing else settled.
func TestDeleteEndpointGoesOnPastABatchShortenedByADelivery(t *testing.T) {
	t.Parallel()
	pool, ep, ids := seededEndpoint(t, discardBatch+2, "")
	ctx := context.Background()
	inFlight := ids[0]
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', attempts = 8, failed_at = now() WHERE id <> $1`, inFlight)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now() WHERE id = $1`, inFlight)
	require.NoError(t, err)

	// The relay records the in-flight message delivered while the deletion's
	// first batch waits for its row.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(),
		claim_token = NULL, claimed_at = NULL WHERE id = $1`, inFlight)
	require.NoError(t, err)
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	deleted := deleteAside(admin, ep)
	waitForALockWait(t, pool, "the deletion waits for the message being recorded")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-deleted)

	var delivered, discarded, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'delivered'),
		count(*) FILTER (WHERE status = 'discarded'), count(*) FILTER (WHERE status NOT IN ('delivered', 'discarded'))
		FROM outbox_messages`).Scan(&delivered, &discarded, &other))
	require.Equal(t, 1, delivered, "the relay's delivery stands")
	require.Equal(t, discardBatch+1, discarded, "every failed message is discarded")
	require.Zero(t, other)
}

// "Retry all failed" of a deleted endpoint requeues nothing, as a retry of
// one of its messages does not: what its deletion left failed (for the
// orphan job to discard) is settled, not to be sent again.
func TestRetryFailedForADeletedEndpointRequeuesNothing(t *testing.T) {
	t.Parallel()
	pool, ep := deletedEndpoint(t, 3, "", "status = 'failed', attempts = 8, failed_at = now()")
	ctx := context.Background()
	admin := NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	n, err := admin.RetryFailedForEndpoint(ctx, ep)
	require.ErrorIs(t, err, ErrNotFound)
	require.Zero(t, n)
	var failed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'failed'`).Scan(&failed))
	require.Equal(t, 3, failed, "left for the orphan job to discard")
}
