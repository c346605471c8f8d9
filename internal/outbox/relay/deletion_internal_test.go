package relay

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// Deleting an endpoint takes row locks in the relay's order, its messages
// before the endpoint: a relay recording a claimed message of it and then
// settling the destination's lease (both in one transaction, as a deliver
// job ends) finishes, and so does the deletion, with no deadlock.
func TestDeleteEndpointBesideAJobEndingDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	ep := outboxtest.Endpoint(t, pool, nil)
	ids := outboxtest.Seed(t, pool, ep, 1, "")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now() WHERE id = $1`, ids[0])
	require.NoError(t, err)

	// The job ending: its outcome recorded first.
	job, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer job.Rollback(ctx) //nolint:errcheck
	_, err = job.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(), claim_token = NULL, claimed_at = NULL WHERE id = $1`, ids[0])
	require.NoError(t, err)

	deleted := deleteAside(adm, ep)
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
	outboxtest.Seed(t, pool, dest, 1, "")
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
	n, err := outboxdb.New(del).MessagesDiscardForDestination(ctx, "endpoint deleted", dest, 10_000)
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
	require.Equal(t, outbox.StatusDiscarded, status, "what the deletion settled stands")
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
	outboxtest.Seed(t, pool, dest, 2, "")
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
		settled <- inTx(ctx, pool, func(tx pgx.Tx) error { return s.settleWrite(ctx, tx, outbox.HealthHealthy, nil, nil) })
	}()
	waitForALockWait(t, pool, "the job's end waits for the message the deletion holds")

	// The deletion reaches the message the job recorded: the cycle.
	n, err := outboxdb.New(del).MessagesDiscardForDestination(ctx, "endpoint deleted", dest, 10_000)
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
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	outboxtest.Seed(t, pool, dest, 2, "")
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

	deleted := deleteAside(adm, dest)
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
	require.Equal(t, []string{outbox.StatusDiscarded, outbox.StatusDelivered}, statuses, "the released message discarded, the delivered one kept")
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
func deleteAside(admin *admin.Service, ep uuid.UUID) <-chan error {
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
	r, err := New(pool, Config{}, &HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}, logger, nil)
	require.NoError(t, err)
	return r
}

// A deletion goes on discarding after a batch that came back short only
// because the relay delivered one of its messages meanwhile (the batch's
// re-check keeps it delivered): it stopped there, with the rest of the
// endpoint's failed messages left failed, which nothing else settled.
func TestDeleteEndpointGoesOnPastABatchShortenedByADelivery(t *testing.T) {
	t.Parallel()
	pool, ep, ids := seededEndpoint(t, 10_000+2, "")
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
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	deleted := deleteAside(adm, ep)
	waitForALockWait(t, pool, "the deletion waits for the message being recorded")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-deleted)

	var delivered, discarded, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'delivered'),
		count(*) FILTER (WHERE status = 'discarded'), count(*) FILTER (WHERE status NOT IN ('delivered', 'discarded'))
		FROM outbox_messages`).Scan(&delivered, &discarded, &other))
	require.Equal(t, 1, delivered, "the relay's delivery stands")
	require.Equal(t, 10_000+1, discarded, "every failed message is discarded")
	require.Zero(t, other)
}
