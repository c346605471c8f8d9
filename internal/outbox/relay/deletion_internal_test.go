package relay

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A deletion locks the endpoint's row first, then discards only what it
// can lock at once (SKIP LOCKED): it never waits for a message. A job
// ending beside it (its outcome recorded, an unsent message released, the
// destination's lease settled, in one transaction) holds the endpoint's
// row from its recording on, so the deletion waits for the job's end, and
// then settles what the job left pending; neither is aborted. Before, each
// locked several of the destination's messages in its own order,
// PostgreSQL broke the cycle by aborting one after deadlock_timeout, and
// both had to run their transactions again.
func TestADeletionBesideAJobEndingWaitsForTheJobAlone(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	outboxtest.Seed(t, pool, dest, 3, "")
	s, rows := claimedSession(t, pool, dest, lease, 2)
	require.Len(t, rows, 2)
	s.rec.record(judged(s.r.cfg, rows[0], Result{StatusCode: http.StatusNoContent}))
	s.rec.release(rows[1].ID, "")

	// The job's end, up to the destination's lease: its messages and the
	// endpoint's row locked by its recording.
	job, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer job.Rollback(ctx) //nolint:errcheck
	var recorded []outcome
	require.NoError(t, s.rec.write(ctx, job, s.rec.pending, &recorded))
	require.Len(t, recorded, 1)

	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	deleted := deleteAside(adm, dest)
	waitForALockWait(t, pool, "the deletion waits for the endpoint's row the job holds")
	due, err := outboxdb.New(job).DestinationSettle(ctx, outboxdb.DestinationSettleParams{ID: dest, LeaseToken: lease, Url: outboxtest.EndpointURL, Health: outbox.HealthHealthy})
	require.NoError(t, err, "the job's end goes on: it holds everything it needs")
	require.True(t, due, "the message never claimed is due")
	require.NoError(t, job.Commit(ctx), "the job's end commits")
	require.NoError(t, <-deleted, "and the deletion finishes after it")

	statuses := map[string]int{}
	srows, err := pool.Query(ctx, `SELECT status FROM outbox_messages WHERE destination = $1`, dest)
	require.NoError(t, err)
	for _, st := range must(pgx.CollectRows(srows, pgx.RowTo[string]))(t) {
		statuses[st]++
	}
	require.Equal(t, map[string]int{outbox.StatusDelivered: 1, outbox.StatusDiscarded: 2}, statuses,
		"what the job recorded stands; what it released, and the message never claimed, are discarded")
}

// claimedSession is a deliver job's session of dest under lease, with the
// River client its recordings need, and what it claimed: up to n messages.
func claimedSession(t *testing.T, pool *pgxpool.Pool, dest, lease uuid.UUID, n int32) (*session, []outboxdb.MessageClaimRow) {
	t.Helper()
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	client, err := r.newRiverClient()
	require.NoError(t, err)
	r.client = client
	rows, err := claimMessages(context.Background(), pool, outboxdb.MessageClaimParams{
		ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: n})
	require.NoError(t, err)
	return &session{r: r, dest: dest, token: lease, pace: newPace(r.cfg, outboxdb.DestinationLeaseRow{}), rec: newRecorder(r, dest, lease)}, rows
}

// must fails t on err and returns v.
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		require.NoError(t, err)
		return v
	}
}

// The other order: a deletion holding the destination's lock and the
// endpoint's row (it is discarding the destination's messages) and a job
// ending. The job waits for the deletion, and finds its claims discarded:
// it records nothing, and neither is aborted.
func TestAJobEndingBesideADeletionWaitsForIt(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	outboxtest.Seed(t, pool, dest, 2, "k")
	s, rows := claimedSession(t, pool, dest, lease, 2)
	require.Len(t, rows, 1, "the first of the key; the second parked")
	s.rec.record(judged(s.r.cfg, rows[0], Result{StatusCode: http.StatusNoContent}))

	del, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer del.Rollback(ctx) //nolint:errcheck
	q := outboxdb.New(del)
	require.NoError(t, q.DestinationLock(ctx, dest))
	_, err = q.EndpointLockForDelete(ctx, dest)
	require.NoError(t, err)
	n, err := q.MessagesDiscardForDestination(ctx, "endpoint deleted", dest, 10_000)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the claimed message and the parked one")

	settled := make(chan error, 1)
	go func() {
		var recorded []outcome
		var due bool
		settled <- s.settleWrite(ctx, s.rec.pending, &recorded, &due, outbox.HealthHealthy, nil, nil, 0)
	}()
	waitForALockWait(t, pool, "the job's end waits for the deletion")
	_, err = q.EndpointDelete(ctx, dest)
	require.NoError(t, err)
	require.NoError(t, del.Commit(ctx))
	require.NoError(t, <-settled, "the job's end finishes, not aborted")
	var discarded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'discarded'`, dest).Scan(&discarded))
	require.Equal(t, 2, discarded, "what the deletion settled stands; the job's outcome found no claim to record")
}

// A destination's recovery, as its probe gets an answer (messages brought
// forward, then the endpoint marked healthy), beside a deletion holding
// the endpoint's row: the recovery waits, then finds nothing to change,
// and neither is aborted.
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
	rc := newRecorder(r, dest, lease)
	_, err = outboxdb.New(pool).MessagesRecordOutcomes(ctx, rc.params([]outcome{judged(r.cfg, rows[0], Result{Err: errors.New("connection refused")})}))
	require.NoError(t, err)

	del, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer del.Rollback(ctx) //nolint:errcheck
	q := outboxdb.New(del)
	require.NoError(t, q.DestinationLock(ctx, dest))
	_, err = q.EndpointLockForDelete(ctx, dest)
	require.NoError(t, err)
	n, err := q.MessagesDiscardForDestination(ctx, "endpoint deleted", dest, 10_000)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	s := &session{r: r, dest: dest, token: lease}
	recovered := make(chan struct{})
	go func() {
		defer close(recovered)
		s.recovered(ctx)
	}()
	waitForALockWait(t, pool, "the recovery waits for the message the deletion holds")
	deleted, err := q.EndpointDelete(ctx, dest)
	require.NoError(t, err, "the deletion's lock on the endpoint is not a deadlock")
	require.EqualValues(t, 1, deleted)
	require.NoError(t, del.Commit(ctx))
	<-recovered
	require.NotContains(t, logs.String(), "recording destination recovered", "the recovery's write did not fail")
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE destination = $1`, dest).Scan(&status))
	require.Equal(t, outbox.StatusDiscarded, status, "what the deletion settled stands")
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
// because the relay was recording one of its messages (the batch skips it):
// it stopped there, with the rest of the endpoint's failed messages left
// failed, which nothing else settled.
func TestDeleteEndpointGoesOnPastABatchShortenedByADelivery(t *testing.T) {
	t.Parallel()
	pool, ep, ids := seededEndpoint(t, 10_000+2, "")
	ctx := context.Background()
	inFlight := ids[0]
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', attempts = 8, failed_at = now() WHERE id <> $1`, inFlight)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now() WHERE id = $1`, inFlight)
	require.NoError(t, err)

	// The relay records the in-flight message delivered while the deletion
	// runs: the deletion's first batch skips its row, and comes back short.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now(),
		claim_token = NULL, claimed_at = NULL WHERE id = $1`, inFlight)
	require.NoError(t, err)
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	_, err = adm.DeleteEndpoint(ctx, ep)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	var delivered, discarded, other int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'delivered'),
		count(*) FILTER (WHERE status = 'discarded'), count(*) FILTER (WHERE status NOT IN ('delivered', 'discarded'))
		FROM outbox_messages`).Scan(&delivered, &discarded, &other))
	require.Equal(t, 1, delivered, "the relay's delivery stands")
	require.Equal(t, 10_000+1, discarded, "every failed message is discarded")
	require.Zero(t, other)
}
