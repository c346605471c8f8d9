package ops_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox"
)

// recorder keeps the SQL and arguments of every statement run through a
// pool, so a test can EXPLAIN what a page load really ran.
type recorder struct {
	mu    sync.Mutex
	on    bool
	stmts map[string][]any
	runs  map[string]int
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on && !strings.HasPrefix(strings.ToLower(d.SQL), "begin") && !strings.EqualFold(d.SQL, "commit") &&
		!strings.EqualFold(d.SQL, "rollback") {
		r.stmts[d.SQL] = d.Args
		r.runs[d.SQL]++
	}
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

var buffersRe = regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?`)

// The overview stays cheap whatever the delivered history: with 1,000,000
// delivered messages (and their events and attempts) kept for the
// retention, every statement a page load runs reads outbox_messages and
// outbox_events only through indexes, and none reads more than a few
// hundred pages. Counting the delivered rows, as the admin API's stats do,
// reads them all.
func TestOverviewStaysOnIndexesWithAMillionDelivered(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds a million rows")
	}
	t.Parallel()
	ctx := context.Background()
	pool, rec := recordedPool(t)

	start := time.Now()
	_, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		SELECT 'http://127.0.0.1:9/' || g, 'whsec_AAAA', '{order.placed}' FROM generate_series(1, 5) g;
		CREATE TEMP TABLE seed AS
			SELECT outbox_uuid_v7_at(now() - interval '3 days' + g * interval '100 milliseconds') AS id,
			       now() - interval '3 days' + g * interval '100 milliseconds' AS at, g
			FROM generate_series(1, 1000000) g;
		INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT id, 'order.placed', '{"id":"x"}', at FROM seed;
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, delivered_at, created_at, next_attempt_at)
			SELECT outbox_uuid_sibling(s.id), s.id, 'order.placed',
			       e.ids[1 + s.g % 5], 'delivered', 1, s.at, s.at, s.at
			FROM seed s, (SELECT array_agg(id) AS ids FROM webhook_endpoints) e;
		INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
			SELECT id, 1, 'delivered', delivered_at, delivered_at, 204 FROM outbox_messages;
		ANALYZE;`)
	require.NoError(t, err)
	t.Logf("seeded 1,000,000 delivered messages, events and attempts in %s", time.Since(start).Round(time.Millisecond))
	// What an operator looks at: a few waiting, claimed and failed.
	_, err = pool.Exec(ctx, `
		WITH e AS (SELECT id FROM webhook_endpoints ORDER BY id LIMIT 1),
		ev AS (INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7(), 'order.placed', '{}', now() FROM generate_series(1, 30) RETURNING id)
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, claim_token, claimed_at, failed_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', e.id, st, CASE WHEN st = 'failed' THEN 5 ELSE 0 END,
		       CASE WHEN st = 'claimed' THEN gen_random_uuid() END, CASE WHEN st = 'claimed' THEN now() END,
		       CASE WHEN st = 'failed' THEN now() END
		FROM e, (SELECT id, (ARRAY['pending', 'claimed', 'failed'])[1 + row_number() OVER () % 3] AS st FROM ev) ev`)
	require.NoError(t, err)

	body, stmts, _ := loadOverview(t, pool, rec)
	require.Contains(t, body, `id="failed-count" data-value="10"`, "failed messages are counted exactly")
	require.Contains(t, body, `id="pending-count" data-value="10"`, "pending messages are counted exactly")
	require.Contains(t, body, `data-estimate="10000`, "the delivered history is shown as an estimate")
	require.GreaterOrEqual(t, len(stmts), 5, "the page's statements were recorded")

	for sql, args := range stmts {
		plan := explain(t, pool, sql, args)
		text := strings.Join(plan, "\n")
		t.Logf("%s\n%s", sql, text)
		require.NotRegexp(t, `Seq Scan on outbox_(messages|events|attempts)`, text, "an overview statement reads the history:\n%s", sql)
		// The top node's buffers include its children's.
		var pages int
		for _, line := range plan {
			if m := buffersRe.FindStringSubmatch(line); m != nil {
				hit, _ := strconv.Atoi(m[1])
				read, _ := strconv.Atoi(m[2])
				pages = hit + read
				break
			}
		}
		require.Less(t, pages, 1000, "an overview statement reads %d pages, as many as the history:\n%s", pages, sql)
	}
}

// recordedPool returns a pool on a database of its own whose statements
// rec records while rec.on.
func recordedPool(t *testing.T) (*pgxpool.Pool, *recorder) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	rec := &recorder{stmts: map[string][]any{}, runs: map[string]int{}}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, rec
}

// loadOverview loads the ops overview once, recording its statements: the
// page, and each statement with its arguments and how often it ran.
func loadOverview(t *testing.T, pool *pgxpool.Pool, rec *recorder) (string, map[string][]any, map[string]int) {
	t.Helper()
	admin := outbox.NewAdmin(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(ops.New(ops.Options{Admin: admin, Pool: pool, Token: token, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	rec.mu.Lock()
	rec.on = true
	rec.mu.Unlock()
	res, body := get(t, http.DefaultClient, srv.URL+"/ops", "Authorization", "Bearer "+token)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.on = false
	require.Equal(t, http.StatusOK, res.StatusCode)
	return body, rec.stmts, rec.runs
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of a statement in a transaction
// it rolls back, and returns the plan's lines.
func explain(t *testing.T, pool *pgxpool.Pool, sql string, args []any) []string {
	t.Helper()
	ctx := context.Background()
	var plan []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		if err != nil {
			return err
		}
		plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		return errRollback
	})
	require.ErrorIs(t, err, errRollback, sql)
	return plan
}

// A scan of outbox_messages in a plan, with the rows it returned per loop.
var messagesScanRe = regexp.MustCompile(`(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan)(?: Backward)?(?: using \S+)? on outbox_messages\b.*actual time=\S+ rows=(\d+) loops=(\d+)`)

// An endpoint paused for a day holds a backlog of millions, and that is
// when an operator opens the page: a page load reads what waits once, not
// once per panel (the counts, the relay's due backlog, the backlog chart,
// every endpoint's waiting messages). The messages that EXPLAIN ANALYZE
// says the page's statements read from outbox_messages, each statement
// counted as often as the page ran it, are the backlog once and a few
// more (the recent and failed lists), not two or four times the backlog.
func TestOverviewReadsTheBacklogOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, rec := recordedPool(t)

	const waiting = 20_000
	// Two days old, so that the page's one-hour charts do not read them
	// as new arrivals.
	_, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types, enabled)
		VALUES ('http://127.0.0.1:9/paused', 'whsec_AAAA', '{order.placed}', false),
		       ('http://127.0.0.1:9/live', 'whsec_AAAA', '{order.placed}', true);
		CREATE TEMP TABLE seed AS
			SELECT outbox_uuid_v7_at(now() - interval '2 days' + g * interval '1 millisecond') AS id,
			       now() - interval '2 days' + g * interval '1 millisecond' AS at
			FROM generate_series(1, `+strconv.Itoa(waiting)+`) g;
		INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT id, 'order.placed', '{"id":"x"}', at FROM seed;
		INSERT INTO outbox_messages (id, event_id, type, destination, created_at, next_attempt_at)
			SELECT outbox_uuid_sibling(s.id), s.id, 'order.placed', e.id, s.at, s.at
			FROM seed s, webhook_endpoints e WHERE NOT e.enabled;
		ANALYZE;`)
	require.NoError(t, err)

	body, stmts, runs := loadOverview(t, pool, rec)
	require.Contains(t, body, `id="pending-count" data-value="`+strconv.Itoa(waiting)+`"`, "every waiting message is counted")

	read := 0
	for sql, args := range stmts {
		for _, line := range explain(t, pool, sql, args) {
			if m := messagesScanRe.FindStringSubmatch(line); m != nil {
				rows, _ := strconv.Atoi(m[1])
				loops, _ := strconv.Atoi(m[2])
				read += rows * loops * runs[sql]
			}
		}
	}
	t.Logf("a page load read %d messages with %d waiting", read, waiting)
	require.GreaterOrEqual(t, read, waiting, "the waiting messages were counted, so read")
	require.Less(t, read, waiting+waiting/2, "a page load reads the waiting messages more than once")
}

var errRollback = errors.New("rollback")
