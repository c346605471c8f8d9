package ops_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox/admin"
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

// during records the statements run by do alone, each with its last
// arguments.
func (r *recorder) during(do func()) map[string][]any {
	r.mu.Lock()
	r.on, r.stmts, r.runs = true, map[string][]any{}, map[string]int{}
	r.mu.Unlock()
	do()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.stmts
}

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

	requireOffTheHistory(t, pool, stmts)
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
	return loadPage(t, pool, rec, "/ops")
}

// loadPage loads one ops page as loadOverview loads the overview.
func loadPage(t *testing.T, pool *pgxpool.Pool, rec *recorder, path string) (string, map[string][]any, map[string]int) {
	t.Helper()
	admin := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(ops.New(ops.Options{Admin: admin, Pool: pool, Token: token, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	rec.mu.Lock()
	rec.on = true
	rec.mu.Unlock()
	res, body := get(t, http.DefaultClient, srv.URL+path, "Authorization", "Bearer "+token)
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
	var plan []string
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		plan = dbtest.PlanLines(t, tx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		return dbtest.ErrRollback
	})
	require.ErrorIs(t, err, dbtest.ErrRollback, sql)
	return plan
}

// messagesRead returns how many rows of outbox_messages a statement reads,
// as EXPLAIN ANALYZE counts them.
func messagesRead(t *testing.T, pool *pgxpool.Pool, sql string, args []any) int {
	t.Helper()
	return rowsRead(t, pool, sql, args, "outbox_messages")
}

// rowsRead is how many rows of table the statement's scans return, as
// EXPLAIN ANALYZE says.
func rowsRead(t *testing.T, pool *pgxpool.Pool, sql string, args []any, table string) int {
	t.Helper()
	scanRe := regexp.MustCompile(`(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan)(?: Backward)?(?: using \S+)? on ` + table + `(?:_legacy|_p\d{8}t\d{4})?\b.*actual time=\S+ rows=(\d+) loops=(\d+)`)
	read := 0
	for _, line := range explain(t, pool, sql, args) {
		if m := scanRe.FindStringSubmatch(line); m != nil {
			rows, _ := strconv.Atoi(m[1])
			loops, _ := strconv.Atoi(m[2])
			read += rows * loops
		}
	}
	return read
}

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
	require.Regexp(t, `id="partitions" data-count="\d+" data-oldest="legacy" data-held-by="pending"`, body,
		"the oldest partition, and what keeps it: the paused endpoint's backlog")

	read := 0
	for sql, args := range stmts {
		read += messagesRead(t, pool, sql, args) * runs[sql]
	}
	t.Logf("a page load read %d messages with %d waiting", read, waiting)
	require.GreaterOrEqual(t, read, waiting, "the waiting messages were counted, so read")
	require.Less(t, read, waiting+waiting/2, "a page load reads the waiting messages more than once")
}

// An endpoint's page costs the same at any delivery rate. With 200,000
// attempts in the endpoint's last day (one in ten refused), its success
// rate and latency percentiles come from the attempts summed by minute:
// no statement of the page reads the history, and each reads a few hundred
// pages at most. The figures agree with the history they sum: the counts
// exactly, and the percentiles (estimated from request-time buckets) with
// PostgreSQL's own over the same attempts, here within 5 %. A quiet
// endpoint's page beside it reads no more.
func TestEndpointPageCostsTheSameAtAnyRate(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 200,000 attempts")
	}
	t.Parallel()
	ctx := context.Background()
	pool, rec := recordedPool(t)

	// From 23 hours ago to 5 minutes ago, request times of 1 to 100 ms.
	var endpoint string
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/busy', 'whsec_AAAA', '{order.placed}') RETURNING id::text`).Scan(&endpoint))
	_, err := pool.Exec(ctx, `
		CREATE TEMP TABLE seed AS
			SELECT id, outbox_uuid_sibling(id) AS message_id, at, g
			FROM generate_series(1, 200000) g,
			     LATERAL (SELECT now() - interval '23 hours' + g * (interval '22 hours 55 minutes' / 200000) AS at) t,
			     LATERAL (SELECT outbox_uuid_v7_at(at) AS id) i;
		INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT id, 'order.placed', '{"id":"x"}', at FROM seed;
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, delivered_at, created_at, next_attempt_at)
			SELECT message_id, id, 'order.placed', '`+endpoint+`', 'delivered', 1, at, at, at FROM seed;
		INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
			SELECT message_id, 1, CASE WHEN g % 10 = 0 THEN 'retry' ELSE 'delivered' END,
			       at - make_interval(secs => (1 + g % 100) / 1000.0), at, CASE WHEN g % 10 = 0 THEN 500 ELSE 204 END
			FROM seed;
		SELECT outbox_attempt_minutes_recount(now() - interval '1 day');
		ANALYZE;`)
	require.NoError(t, err)
	id, err := uuid.Parse(endpoint)
	require.NoError(t, err)
	admin := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))

	// The history's own figures over the same whole minutes, read in the
	// same minute as the page (or read again).
	type figures struct {
		hourAttempts, hourDelivered, dayAttempts, dayDelivered int64
		p50, p95, p99                                          float64
	}
	var (
		want, gotFigures figures
		body             string
		stmts            map[string][]any
	)
	for range 3 {
		var before, after time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT date_trunc('minute', now())`).Scan(&before))
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE a.finished_at >= date_trunc('minute', now()) - interval '59 minutes'),
			       count(*) FILTER (WHERE a.finished_at >= date_trunc('minute', now()) - interval '59 minutes' AND a.outcome = 'delivered'),
			       count(*), count(*) FILTER (WHERE a.outcome = 'delivered'),
			       percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(epoch FROM a.finished_at - a.started_at) * 1000) FILTER (WHERE a.outcome = 'delivered'),
			       percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(epoch FROM a.finished_at - a.started_at) * 1000) FILTER (WHERE a.outcome = 'delivered'),
			       percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(epoch FROM a.finished_at - a.started_at) * 1000) FILTER (WHERE a.outcome = 'delivered')
			FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
			WHERE m.destination = $1 AND a.finished_at >= date_trunc('minute', now()) - interval '1439 minutes'`, id).Scan(
			&want.hourAttempts, &want.hourDelivered, &want.dayAttempts, &want.dayDelivered, &want.p50, &want.p95, &want.p99))
		body, stmts, _ = loadPage(t, pool, rec, "/ops/endpoints/"+endpoint)
		hour, day, err := admin.EndpointAttemptStats(ctx, id)
		require.NoError(t, err)
		gotFigures = figures{hour.Attempts, hour.Delivered, day.Attempts, day.Delivered, day.P50MS, day.P95MS, day.P99MS}
		require.NoError(t, pool.QueryRow(ctx, `SELECT date_trunc('minute', now())`).Scan(&after))
		if before.Equal(after) {
			break
		}
	}
	require.Greater(t, want.hourAttempts, int64(0), "the seed reaches into the last hour")
	require.Equal(t, int64(200000), want.dayAttempts, "the seed is within the day")
	require.Equal(t, []int64{want.hourAttempts, want.hourDelivered, want.dayAttempts, want.dayDelivered},
		[]int64{gotFigures.hourAttempts, gotFigures.hourDelivered, gotFigures.dayAttempts, gotFigures.dayDelivered},
		"hour attempts, hour delivered, day attempts, day delivered: as in the history")
	require.Contains(t, body, `id="success-hour" data-attempts="`+strconv.FormatInt(want.hourAttempts, 10)+`" data-delivered="`+strconv.FormatInt(want.hourDelivered, 10)+`">`)
	require.Contains(t, body, `<span id="success-day">90%</span> of 200,000`)
	require.InEpsilon(t, want.p50, gotFigures.p50, 0.05, "p50")
	require.InEpsilon(t, want.p95, gotFigures.p95, 0.05, "p95")
	require.InEpsilon(t, want.p99, gotFigures.p99, 0.05, "p99")

	require.GreaterOrEqual(t, len(stmts), 3, "the page's statements were recorded")
	requireOffTheHistory(t, pool, stmts)

	// A quiet endpoint beside the busy one: three attempts in the day. Its
	// page lists them from its own few minutes of the history, not from a
	// walk back through the busy one's day.
	var quiet string
	require.NoError(t, pool.QueryRow(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/quiet', 'whsec_AAAA', '{order.placed}') RETURNING id::text`).Scan(&quiet))
	_, err = pool.Exec(ctx, `
		CREATE TEMP TABLE quiet AS
			SELECT id, outbox_uuid_sibling(id) AS message_id, at
			FROM unnest(ARRAY[1, 10, 20]) h,
			     LATERAL (SELECT now() - make_interval(hours => h) AS at) t,
			     LATERAL (SELECT outbox_uuid_v7_at(at) AS id) i;
		INSERT INTO outbox_events (id, type, payload, created_at) SELECT id, 'order.placed', '{"id":"q"}', at FROM quiet;
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, delivered_at, created_at, next_attempt_at)
			SELECT message_id, id, 'order.placed', '`+quiet+`', 'delivered', 1, at, at, at FROM quiet;
		INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
			SELECT message_id, 1, 'delivered', at - interval '7 ms', at, 204 FROM quiet;
		SELECT outbox_attempt_minutes_recount(now() - interval '1 day');
		ANALYZE;`)
	require.NoError(t, err)
	body, stmts, _ = loadPage(t, pool, rec, "/ops/endpoints/"+quiet)
	require.Equal(t, 3, strings.Count(body, `<tr data-outcome=`), "its three attempts, none of the busy one's")
	// What the history holds in the quiet endpoint's three minutes (its
	// own and the busy one's) is all a statement may read of it: a few
	// hundred of the day's 200,000.
	var inItsMinutes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts
		WHERE date_trunc('minute', finished_at) IN (SELECT minute FROM outbox_attempt_minutes WHERE destination = $1)`,
		quiet).Scan(&inItsMinutes))
	require.Less(t, inItsMinutes, 1000)
	for sql, args := range stmts {
		// EXPLAIN rounds the rows of a loop, so each loop may show one more.
		read, slack := 0, 0
		plan := explain(t, pool, sql, args)
		for _, line := range plan {
			if m := attemptsScanRe.FindStringSubmatch(line); m != nil {
				rows, _ := strconv.Atoi(m[1])
				loops, _ := strconv.Atoi(m[2])
				read, slack = read+rows*loops, slack+loops
			}
		}
		require.LessOrEqual(t, read, inItsMinutes+slack, "a statement of the quiet endpoint's page reads the history beyond its minutes:\n%s\n%s",
			sql, strings.Join(plan, "\n"))
		require.Empty(t, dbtest.SeqScansOfHistory(t, strings.Join(plan, "\n"), `outbox_(messages|events|attempts)`), sql)
	}
}

// attemptsScanRe finds a plan's reads of outbox_attempts: rows per loop, and loops.
var attemptsScanRe = regexp.MustCompile(`(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan)(?: Backward)?(?: using \S+)? on outbox_attempts(?:_legacy|_p\d{8}t\d{4})?\b.*actual time=\S+ rows=(\d+) loops=(\d+)`)

// requireOffTheHistory requires that no statement of a page load scans
// outbox_messages, outbox_events or outbox_attempts whole, and that none
// reads 1,000 pages or more: as many as a history of any size would take.
func requireOffTheHistory(t *testing.T, pool *pgxpool.Pool, stmts map[string][]any) {
	t.Helper()
	for sql, args := range stmts {
		plan := explain(t, pool, sql, args)
		text := strings.Join(plan, "\n")
		t.Logf("%s\n%s", sql, text)
		require.Empty(t, dbtest.SeqScansOfHistory(t, text, `outbox_(messages|events|attempts)`), "a page's statement reads the history:\n%s", sql)
		pages := dbtest.RootBuffers(t, text)
		require.Less(t, pages, 1000, "a page's statement reads %d pages, as many as the history:\n%s", pages, sql)
	}
}

// The overview's arrivals chart counts each minute once: a process keeps
// the counts of the minutes that are over, and a later page load counts only
// the last minutes' messages, not the hour's. With 58,000 messages created
// over the last hour, the second load's count reads a few minutes of them,
// and both loads show the same arrivals.
func TestOverviewCountsArrivalsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, rec := recordedPool(t)
	const created = 58_000
	// From 58 minutes ago to a minute ago: a new minute starting between
	// the loads drops no arrival from the 60-minute window.
	_, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/hook', 'whsec_AAAA', '{order.placed}');
		CREATE TEMP TABLE seed AS
			SELECT outbox_uuid_v7_at(at) AS id, at
			FROM generate_series(1, `+strconv.Itoa(created)+`) g,
			     LATERAL (SELECT now() - interval '58 minutes' + g * (interval '57 minutes' / `+strconv.Itoa(created)+`) AS at) t;
		INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT id, 'order.placed', '{"id":"x"}', at FROM seed;
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, delivered_at, created_at, next_attempt_at)
			SELECT outbox_uuid_sibling(s.id), s.id, 'order.placed', e.id, 'delivered', 1, s.at, s.at, s.at
			FROM seed s, webhook_endpoints e;
		ANALYZE;`)
	require.NoError(t, err)
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))

	// load reads the dashboard as the overview does, and returns the
	// arrivals it shows and how many messages its count of them read.
	load := func() (shown, read int) {
		var d admin.Dashboard
		stmts := rec.during(func() {
			var err error
			d, err = adm.Dashboard(ctx, time.Now(), 60, time.Hour)
			require.NoError(t, err)
		})
		for _, m := range d.Activity.Minutes {
			shown += int(m.Created)
		}
		counted := false
		for sql, args := range stmts {
			if !strings.Contains(sql, "OpsCreatedPerMinute") {
				continue
			}
			counted = true
			read += messagesRead(t, pool, sql, args)
		}
		require.True(t, counted, "the dashboard counts arrivals")
		return shown, read
	}
	shown, read := load()
	require.Equal(t, created, shown, "the first load shows every arrival")
	require.GreaterOrEqual(t, read, created, "and counted them all")

	shown, read = load()
	t.Logf("the second load's count read %d messages of %d", read, created)
	require.Equal(t, created, shown, "the second load shows the same arrivals")
	require.Less(t, read, created/10, "the second load counted the last minutes only")
}

// The overview's day of delivery lags is read once: a process keeps the
// lags of the minutes that are over, and a later page load reads the last
// minutes' rows only. With 100 endpoints delivering in every minute of the
// day (285,600 rows of lags), the second load reads a few minutes of them,
// and both show the same day. The rows stop ten minutes short of the day's
// start, so a minute that ends between the insert and a load drops none.
func TestOverviewReadsADayOfLagsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, rec := recordedPool(t)
	const endpoints, perMinute = 100, 2
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_delivery_lag_minutes (destination, minute, le_ms, deliveries, min_ms, max_ms)
		SELECT d, date_trunc('minute', now()) - make_interval(mins => m), outbox_lag_bucket_ms(ms), 3, ms, ms
		FROM (SELECT gen_random_uuid() AS d FROM generate_series(1, $1::integer)) ds,
		     generate_series(2, 1429) m, unnest('{40, 3000}'::float8[]) ms`, endpoints)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE outbox_delivery_lag_minutes`)
	require.NoError(t, err)
	rows := endpoints * (1429 - 1) * perMinute
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))

	load := func() (shown admin.LagStats, read int) {
		var d admin.Dashboard
		stmts := rec.during(func() {
			var err error
			d, err = adm.Dashboard(ctx, time.Now(), 60, time.Hour)
			require.NoError(t, err)
		})
		for sql, args := range stmts {
			if strings.Contains(sql, "outbox_delivery_lag_minutes") && !strings.Contains(sql, "59 minutes") {
				read += rowsRead(t, pool, sql, args, "outbox_delivery_lag_minutes")
			}
		}
		return d.Overview.LagDay, read
	}
	first, read := load()
	require.EqualValues(t, rows*3, first.Deliveries, "the first load shows the day's deliveries")
	require.GreaterOrEqual(t, read, rows, "and read every row of them")
	require.Equal(t, 3000.0, first.P99MS, "half at 40 ms, half at 3 s")

	second, read := load()
	t.Logf("the second load read %d rows of %d", read, rows)
	require.Equal(t, first, second, "the second load shows the same day")
	require.Less(t, read, rows/100, "the second load read the last minutes only")
}

// Whatever UUID an operator pastes into the search box, the search (and
// the page it lands on) reads a few index pages, under the plans the
// statements start with and under the generic plans PostgreSQL switches
// them to: a message, an event and an endpoint are each found on their
// primary key, and a UUID that is none of them is looked for as an
// ordering key on the key's index. With 200,000 events of the last day,
// the search for an event id read every message under a generic plan, and
// a UUID of nothing read every event of the day, when a key's events were
// found by reading a window of time.
func TestSearchForAnIDReadsAFewPagesWhateverTheHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, rec := recordedPool(t)
	_, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types) VALUES ('http://127.0.0.1:9/hook', 'whsec_AAAA', '{order.placed}');
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
			SELECT outbox_uuid_v7_at(s.at), 'order.placed', '{"total":1}', 'order-' || s.g, s.at
			FROM (SELECT g, now() - g * interval '400 milliseconds' AS at FROM generate_series(1, 200000) g) s
			RETURNING id, type, ordering_key, created_at
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, status, attempts, delivered_at, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, e.id, ev.ordering_key, 'delivered', 1, ev.created_at, ev.created_at, ev.created_at
		FROM ev CROSS JOIN webhook_endpoints e;
		ANALYZE outbox_events, outbox_messages;`)
	require.NoError(t, err)
	var event, message, endpoint uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id, id, destination FROM outbox_messages ORDER BY id OFFSET 100000 LIMIT 1`).
		Scan(&event, &message, &endpoint))
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(ops.New(ops.Options{Admin: adm, Pool: pool, Token: token, Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)

	for name, q := range map[string]string{"an event": event.String(), "a message": message.String(), "an endpoint": endpoint.String(),
		"nothing": uuid.NewString(), "an ordering key": "order-100000", "an ordering key's first event": "order-200000"} {
		var res *http.Response
		stmts := rec.during(func() {
			res, _ = get(t, http.DefaultClient, srv.URL+"/ops/search?q="+q, "Authorization", "Bearer "+token)
		})
		require.Equal(t, http.StatusOK, res.StatusCode, name)
		require.NotEmpty(t, stmts)
		for sql, args := range stmts {
			for kind, plan := range map[string]string{
				"custom":  strings.Join(explain(t, pool, sql, args), "\n"),
				"generic": dbtest.ExplainGenericStatement(t, pool, sql, args),
			} {
				pages := dbtest.RootBuffers(t, plan)
				require.Less(t, pages, 200, "searching for %s, a statement's %s plan reads %d pages, as many as the history:\n%s\n%s",
					name, kind, pages, sql, plan)
			}
		}
	}
}
