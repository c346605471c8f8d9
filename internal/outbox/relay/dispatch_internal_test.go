package relay

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A dispatch poll visits about the smaller of two sets, the destinations
// with pending messages and the endpoints that may be served, not every
// destination of the larger one: 2,000 endpoints down and backing off with
// a backlog each, beside a few healthy ones, cost a poll a few dozen index
// probes, as do 2,000 idle healthy endpoints beside a few with work.
// Either way the poll finds exactly the healthy endpoints with due
// messages and those whose backoff is over.
func TestADispatchPollVisitsTheSmallerSet(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string]string{
		"2,000 down with a backlog": `
			INSERT INTO webhook_endpoints (url, secret, event_types, health, consecutive_failures, backoff_until)
			SELECT 'http://127.0.0.1:9/down', 'whsec_AAAA', '{order.placed}', 'backing_off', 9, now() + interval '1 hour'
			FROM generate_series(1, 2000);`,
		"2,000 idle": `
			INSERT INTO webhook_endpoints (url, secret, event_types)
			SELECT 'http://127.0.0.1:9/idle', 'whsec_AAAA', '{order.placed}' FROM generate_series(1, 2000);`,
		// The common case: one endpoint, draining, and its history. Its
		// oldest due message is read from the pending index, never by a
		// scan of the table that reads the delivered rows on the way.
		"one endpoint draining, 100,000 delivered": `
			INSERT INTO webhook_endpoints (url, secret, event_types) VALUES ('http://127.0.0.1:9/draining', 'whsec_AAAA', '{order.placed}');
			INSERT INTO outbox_messages (event_id, type, destination, status, attempts, delivered_at)
			SELECT gen_random_uuid(), 'order.placed', id, 'delivered', 1, now() FROM webhook_endpoints, generate_series(1, 100000);
			INSERT INTO outbox_messages (event_id, type, destination)
			SELECT gen_random_uuid(), 'order.placed', id FROM webhook_endpoints, generate_series(1, 100000);`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, trace := dbtest.TracedPool(t)
			_, err := pool.Exec(ctx, setup+`
				-- 10 healthy with due work, 3 whose backoff is over with due
				-- work, 2 healthy whose messages are not due yet, 2 paused.
				INSERT INTO webhook_endpoints (url, secret, event_types, enabled, backoff_until)
				SELECT 'http://127.0.0.1:9/' || g, 'whsec_AAAA', '{order.placed}', g <= 15,
				       CASE WHEN g BETWEEN 11 AND 13 THEN now() - interval '1 second' END
				FROM generate_series(1, 17) g;
				INSERT INTO outbox_messages (event_id, type, destination, next_attempt_at)
				SELECT gen_random_uuid(), 'order.placed', e.id,
				       CASE WHEN e.url IN ('http://127.0.0.1:9/14', 'http://127.0.0.1:9/15') THEN now() + interval '1 hour' ELSE now() END
				FROM webhook_endpoints e, generate_series(1, 3)
				WHERE e.url <> 'http://127.0.0.1:9/idle';
				ANALYZE;`)
			require.NoError(t, err)

			var want []uuid.UUID
			require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM webhook_endpoints
				WHERE url ~ '/([1-9]|1[0-3]|draining)$'`).Scan(&want))
			require.Len(t, want, 13+strings.Count(name, "draining"))
			got, plan := explainDispatch(t, pool, trace)
			if strings.Contains(name, "delivered") {
				require.Empty(t, dbtest.SeqScansOfHistory(t, plan, `outbox_messages`), "the dispatch reads the history")
			}
			require.ElementsMatch(t, want, got, "the healthy endpoints with due work and those whose backoff is over")

			// Every scan of the two tables, as often as it ran.
			scan := regexp.MustCompile(`Scan.* on (outbox_messages\w*|webhook_endpoints) .*loops=(\d+)`)
			visits := 0
			for _, m := range scan.FindAllStringSubmatch(plan, -1) {
				n, _ := strconv.Atoi(m[2])
				visits += n
			}
			require.Less(t, visits, 150, "a poll visits about the smaller set, not each of the 2,000")
		})
	}
}

// A destination draining a backlog leaves, until a vacuum, the pending
// index's entries of what it delivered at the start of its range. A
// dispatch poll reads the destination from its newest entries and does not
// walk them: every relay runs one every poll interval, and from the start
// of the range each read a page for every hundred or so messages delivered
// (1,400 pages, 2-4 ms a poll, at the end of a drain of 200,000).
func TestADispatchPollDoesNotReadWhatADrainDelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	ep := outboxtest.Endpoint(t, pool, nil)
	_, err := pool.Exec(ctx, `INSERT INTO outbox_messages (event_id, type, destination)
		SELECT gen_random_uuid(), 'order.placed', $1::uuid FROM generate_series(1, 30000)`, ep)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE outbox_messages`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', attempts = 1, delivered_at = now()
		WHERE id IN (SELECT id FROM outbox_messages ORDER BY next_attempt_at, id LIMIT 29000)`)
	require.NoError(t, err)
	var indexPages int
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(pg_relation_size(i.indexrelid))::bigint / 8192
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname LIKE 'outbox_messages%pending_idx'`).Scan(&indexPages))
	require.Greater(t, indexPages, 150, "the delivered messages' entries are still in the pending index")

	for range 2 { // the second poll, after the first marked the dead entries
		got, plan := explainDispatch(t, pool, trace)
		require.Equal(t, []uuid.UUID{ep}, got, "its 1,000 pending messages are due")
		require.Less(t, dbtest.RootBuffers(t, plan), indexPages/4, "the poll walked the entries of what was delivered")
	}
}

// explainDispatch runs a dispatch poll from the top, with room for 100, in
// a transaction rolled back, and returns what it dispatched and its plan
// (EXPLAIN (ANALYZE, BUFFERS)).
func explainDispatch(t *testing.T, pool *pgxpool.Pool, trace *dbtest.Statements) ([]uuid.UUID, string) {
	t.Helper()
	var got []uuid.UUID
	plan := trace.Explain(t, pool, func(tx pgx.Tx) error {
		d, err := outboxdb.New(tx).DestinationsDispatch(context.Background(), uuid.Max, redispatchAfter.Seconds(), 100)
		got = d.Ids
		return err
	})
	t.Logf("dispatch:\n%s", plan)
	return got, plan
}

// One event to 2,000 endpoints at the defaults: every endpoint gets its
// webhook once, each destination by one deliver job. The dispatch queues
// no more jobs than the relay has workers, so no job waits long enough to
// be taken for lost and its destination dispatched again; before, every
// poll queued 50 more, the queue outgrew what the workers ran in five
// seconds, and destinations were dispatched again and again (56,436 jobs
// for 10,000 endpoints). Each job claims its destination's one message
// with the lease, and, with other destinations waiting, ends after its
// request without claiming again: a second claim would find nothing and
// cost about what the first did (polls during a request, and the last
// jobs, which wait out their idle polls, claim a few more).
func TestAFanOutRunsOneDeliverJobPerDestination(t *testing.T) {
	t.Parallel()
	const endpoints = 2000
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	db.ConfigurePool(cfg)
	var claims claimCounter
	cfg.ConnConfig.Tracer = &claims
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	_, err = pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		SELECT $1, 'whsec_AAAA', '{order.placed}' FROM generate_series(1, $2::int)`, srv.URL+"/hook", endpoints)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			VALUES (outbox_uuid_v7_at(now()), 'order.placed', '{"id":"x"}', now()) RETURNING id, created_at)
		INSERT INTO outbox_messages (id, event_id, type, destination, created_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', e.id, ev.created_at FROM ev, webhook_endpoints e`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	startRelay(t, pool, nil)

	require.Eventually(t, func() bool {
		var left int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status <> 'delivered'`).Scan(&left))
		return left == 0
	}, 2*time.Minute, 50*time.Millisecond, "every endpoint's message delivered")
	require.EqualValues(t, endpoints, requests.Load(), "each endpoint got its webhook once")
	var jobs, most int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max(n) FROM (
		SELECT count(*) AS n FROM river_job WHERE kind = 'outbox_deliver' GROUP BY args->>'destination') j`).Scan(&jobs, &most))
	require.Equal(t, endpoints, jobs, "a deliver job for every destination")
	require.Equal(t, 1, most, "and one only")
	require.Less(t, claims.n.Load(), int64(endpoints*3/2),
		"a destination with one message is claimed with its lease, and not again: %d claims", claims.n.Load())
}

// claimCounter counts the claim statements run on a pool, alone or in a
// batch.
type claimCounter struct{ n atomic.Int64 }

func (c *claimCounter) count(sql string) {
	if strings.HasPrefix(sql, "-- name: MessageClaim :many") {
		c.n.Add(1)
	}
}

func (c *claimCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

func (c *claimCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *claimCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *claimCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

func (c *claimCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// The redispatch rule, which every way of losing a dispatched destination's
// job rests on (a relay that died between marking it and inserting its
// job, or after fetching the job and before running it): a destination
// dispatched less than redispatchAfter ago is left to its job; after that,
// it is dispatched again unless its job still waits for a worker; and no
// more destinations are dispatched than the workers less the jobs waiting.
func TestADispatchedDestinationWithoutItsJobIsDispatchedAgain(t *testing.T) {
	t.Parallel()
	pool, ep, _ := seededEndpoint(t, 1, "")
	ctx := context.Background()
	r := defaultRelay(t, pool, slog.New(slog.DiscardHandler))
	client, err := r.newRiverClient()
	require.NoError(t, err)
	q := outboxdb.New(pool)
	dispatch := func() outboxdb.DestinationsDispatchRow {
		d, err := q.DestinationsDispatch(ctx, uuid.Max, redispatchAfter.Seconds(), 2)
		require.NoError(t, err)
		return d
	}
	backdate := func() {
		_, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET dispatched_at = now() - make_interval(secs => $2) WHERE id = $1`,
			ep, redispatchAfter.Seconds()+1)
		require.NoError(t, err)
	}

	require.Equal(t, []uuid.UUID{ep}, dispatch().Ids, "due, never dispatched")
	require.Empty(t, dispatch().Ids, "dispatched a moment ago: left to its job, which the caller inserts next")
	backdate()
	require.Equal(t, []uuid.UUID{ep}, dispatch().Ids, "dispatched long ago and no job waits: its job was lost")

	backdate()
	_, err = client.Insert(ctx, deliverArgs{Destination: ep}, nil)
	require.NoError(t, err)
	d := dispatch()
	require.Empty(t, d.Ids, "its job waits for a worker: not dispatched again")
	require.EqualValues(t, 1, d.Waiting)

	_, err = client.Insert(ctx, deliverArgs{Destination: uuid.New()}, nil)
	require.NoError(t, err)
	other := outboxtest.Endpoint(t, pool, nil)
	outboxtest.Seed(t, pool, other, 1, "")
	d = dispatch()
	require.Empty(t, d.Ids, "two jobs wait for the two workers: no room")
	require.EqualValues(t, 2, d.Waiting)
}
