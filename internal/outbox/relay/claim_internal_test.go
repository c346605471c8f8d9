package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
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
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// Concurrent claimers partition the rows: each row is claimed by exactly
// one of them, and none is missed. This is what makes several relays safe.
func TestClaimPartitionsRowsBetweenConcurrentClaimers(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	// One destination whose lease all four hold: in the relay only one job
	// claims for a destination at a time, and SKIP LOCKED is what keeps even
	// a race between two (a lease taken over from a relay declared dead)
	// from sending a message twice.
	lease := uuid.New()
	dest := outboxtest.Endpoint(t, pool, &lease)
	outboxtest.Seed(t, pool, dest, 5000, "")

	const claimers = 4
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	for range claimers {
		wg.Go(func() {
			for {
				var rows []outboxdb.MessageClaimRow
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
					rows, err = claimMessages(ctx, tx, outboxdb.MessageClaimParams{
						ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 50})
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
	cfg := Config{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}.withDefaults()
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
		for range 50 {
			d := cfg.retryDelay(attempt)
			require.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, want, "attempt %d", attempt)
		}
	}
}

// The default schedule keeps a message for more than a day before it fails,
// even with every delay at the short end of its jitter: a receiver down for
// a day loses nothing.
func TestDefaultRetryScheduleOutlastsADayLongOutage(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	require.Equal(t, 8, cfg.MaxAttempts)
	var shortest, longest time.Duration
	// MaxAttempts-1 waits separate the first attempt from the last.
	for attempt := 1; attempt < cfg.MaxAttempts; attempt++ {
		want := cfg.RetrySchedule[attempt-1]
		lo, hi := want, want
		for range 200 {
			d := cfg.retryDelay(attempt)
			lo, hi = min(lo, d), max(hi, d)
		}
		require.GreaterOrEqual(t, lo, want*9/10, "attempt %d: at most 10%% early", attempt)
		require.LessOrEqual(t, hi, want*11/10, "attempt %d: at most 10%% late", attempt)
		require.NotEqual(t, lo, hi, "attempt %d: jittered", attempt)
		shortest += want * 9 / 10
		longest += want * 11 / 10
	}
	require.Greater(t, shortest, 24*time.Hour, "the first and the last attempt are more than a day apart")
	t.Logf("the default schedule's %d attempts span %s to %s", cfg.MaxAttempts, shortest, longest)

	// Past its end the schedule repeats its last entry; BackoffMax caps it.
	require.InDelta(t, float64(10*time.Hour), float64(cfg.retryDelay(20)), float64(time.Hour))
	cfg.BackoffMax = time.Minute
	require.LessOrEqual(t, cfg.retryDelay(5), time.Minute*11/10)
}

func TestProbeDelayDoublesUpToItsCap(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	for n, want := range map[int]time.Duration{0: 5 * time.Second, 1: 10 * time.Second, 2: 20 * time.Second,
		3: 40 * time.Second, 4: time.Minute, 50: time.Minute} {
		d := cfg.probeDelay(n)
		require.InDelta(t, float64(want), float64(d), float64(want)/10+1, "failed probes %d", n)
	}
}

// The relay's statements stay on indexes whatever the delivered history and
// however many destinations there are: with 1,000 endpoints, 200,000
// delivered rows and 20,000 failed ones, 20 endpoints with due messages and
// 50 backing off with a backlog each, neither the claim nor finding the due
// destinations nor the stall check nor the orphan job nor the endpoints'
// next attempts (one probe each) reads outbox_messages but through an
// index. The rows are spread over partitions of several days, as a week
// of history leaves them: delivered ones in each of the last three days,
// the failed ones yesterday, the due ones today, and empty partitions
// ahead.
func TestRelayStatementsStayOnIndexesWith1000Endpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	outboxtest.PartitionsSince(t, pool, time.Now().Add(-3*24*time.Hour))
	_, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		SELECT 'http://127.0.0.1:9/' || g, 'whsec_AAAA', '{order.placed}' FROM generate_series(1, 1000) g;
		INSERT INTO outbox_messages (id, event_id, type, destination, status, delivered_at)
		SELECT outbox_uuid_sibling(outbox_uuid_at(now() - (g % 3) * interval '1 day')), outbox_uuid_v7(), 'order.placed', e.id,
		       'delivered', now() - interval '1 day'
		FROM (SELECT id FROM webhook_endpoints ORDER BY id LIMIT 100) e, generate_series(1, 2000) g;
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, failed_at)
		SELECT outbox_uuid_sibling(outbox_uuid_at(now() - interval '1 day')), outbox_uuid_v7(), 'order.placed', e.id,
		       'failed', 8, now() - interval '1 hour'
		FROM (SELECT id FROM webhook_endpoints ORDER BY id LIMIT 100) e, generate_series(1, 200);
		UPDATE webhook_endpoints SET health = 'backing_off', consecutive_failures = 5, backoff_until = now() + interval '1 hour'
		WHERE id IN (SELECT id FROM webhook_endpoints ORDER BY id DESC LIMIT 50);`)
	require.NoError(t, err)
	// 20 endpoints with 500 due messages each, the older half keyed (50
	// keys of 5), and 1,000 waiting for each endpoint backing off.
	rows, err := pool.Query(ctx, `SELECT id, health FROM webhook_endpoints
		WHERE id IN (SELECT id FROM webhook_endpoints ORDER BY id LIMIT 20) OR health = 'backing_off'`)
	require.NoError(t, err)
	type endpoint struct {
		ID     uuid.UUID
		Health string
	}
	eps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[endpoint])
	require.NoError(t, err)
	for _, e := range eps {
		if e.Health == outbox.HealthBackingOff {
			outboxtest.Seed(t, pool, e.ID, 1000, "")
			continue
		}
		for k := range 50 {
			outboxtest.Seed(t, pool, e.ID, 5, fmt.Sprintf("order-%d", k))
		}
		outboxtest.Seed(t, pool, e.ID, 250, "")
	}
	_, err = pool.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	var dest, token uuid.UUID
	token = uuid.New()
	require.NoError(t, pool.QueryRow(ctx, `UPDATE webhook_endpoints SET lease_token = $1
		WHERE id = (SELECT id FROM webhook_endpoints ORDER BY id LIMIT 1) RETURNING id`, token).Scan(&dest))
	var all []uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id) FROM webhook_endpoints`).Scan(&all))

	for name, run := range map[string]func(q *outboxdb.Queries) error{
		"claim": func(q *outboxdb.Queries) error {
			rows, err := q.MessageClaim(ctx, outboxdb.MessageClaimParams{ClaimToken: token, RelayID: uuid.New(), Destination: dest, BatchSize: 16})
			// The 16 oldest due are three keys of five and one of the
			// fourth: the first of each key is claimed, the rest parked.
			require.Len(t, rows, 4)
			return err
		},
		"dispatch": func(q *outboxdb.Queries) error {
			d, err := q.DestinationsDispatch(ctx, uuid.Max, 5, 100)
			require.Len(t, d.Ids, 20, "the 20 endpoints with due messages, not the ones backing off")
			return err
		},
		"overdue": func(q *outboxdb.Queries) error {
			_, err := q.MessageOverdue(ctx)
			return err
		},
		"next attempts": func(q *outboxdb.Queries) error {
			rows, err := q.EndpointNextAttempts(ctx, all)
			require.Len(t, rows, 70, "the 20 endpoints with due messages and the 50 backing off with a backlog")
			return err
		},
		"failed to prune": func(q *outboxdb.Queries) error {
			_, err := q.FailedExpiredDestinations(ctx, time.Now())
			return err
		},
		"prune failed": func(q *outboxdb.Queries) error {
			_, err := q.MessagesPruneFailed(ctx, dest, time.Now(), 100)
			return err
		},
		"promote": func(q *outboxdb.Queries) error {
			_, err := q.MessagesPromote(ctx, []string{"order-1", "order-2"}, dest)
			return err
		},
		"lost claims": func(q *outboxdb.Queries) error {
			_, err := q.ClaimsLostDestinations(ctx)
			return err
		},
		"release lost": func(q *outboxdb.Queries) error {
			_, err := q.MessagesReleaseLost(ctx, dest, 8)
			return err
		},
		"orphans": func(q *outboxdb.Queries) error {
			_, err := q.MessagesDiscardOrphans(ctx, 100)
			return err
		},
		"prune events": func(q *outboxdb.Queries) error {
			_, err := q.EventsPrune(ctx, uuid.Nil, time.Now(), 100)
			return err
		},
	} {
		plan := trace.Explain(t, pool, queries(run))
		if name == "claim" {
			// The relay runs the claim under a generic plan (claimMessages):
			// that one must stay on the indexes too.
			plan += "\n" + trace.ExplainGeneric(t, pool)
		}
		t.Logf("%s:\n%s", name, plan)
		require.Empty(t, dbtest.SeqScansOfHistory(t, plan, `outbox_(messages|events)`), "%s reads the history", name)
		switch name {
		case "prune events":
			require.Regexp(t, dbtest.Index("outbox_messages_pkey"), plan, "an event's messages are a range of the primary key")
		case "prune failed", "failed to prune":
			require.Regexp(t, `outbox_messages_(legacy_|p\d{8}t\d{4}_)?failed(_at|_destination)?_idx`, plan, "failed messages are found on an index of failed rows only")
		case "promote":
			require.Regexp(t, dbtest.Index("outbox_messages_ordering_idx"), plan, "a key's parked messages and what stands ahead of them are on the ordering index")
		case "lost claims", "release lost":
			require.Regexp(t, dbtest.Index("outbox_messages_claimed_idx"), plan, "lost claims are found among the claims in flight")
		case "orphans":
			require.Regexp(t, dbtest.Index("outbox_messages_failed_destination_idx"), plan, "destinations with failed messages are a skip scan")
			require.Regexp(t, dbtest.Index("outbox_messages_pending_idx"), plan, name)
		case "claim":
			require.Regexp(t, dbtest.Index("outbox_messages_ordering_idx"), plan, "a keyed message's predecessors are looked up on the ordering index")
			require.NotRegexp(t, dbtest.Index("outbox_messages_claimed_idx"), plan,
				"a keyed message's claimed predecessor is found among its key's, not among every claim of every destination")
			fallthrough
		default:
			require.Regexp(t, dbtest.Index("outbox_messages_pending_idx"), plan, name)
		}
	}
}

// With one destination (the usual start: one endpoint) its messages are all
// of the table, and a generic plan that joined the claimed rows by hash
// would read every message. The claim's runs on the primary key.
func TestClaimGenericPlanStaysOnIndexesWithOneDestination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	token := uuid.New()
	dest := outboxtest.Endpoint(t, pool, &token)
	outboxtest.Seed(t, pool, dest, 20000, "")
	_, err := pool.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	plan := claimGenericPlan(t, pool, trace, token, dest, 32)
	require.Empty(t, dbtest.SeqScansOfHistory(t, plan, `outbox_(messages|events)`), "the claim reads every message")
	require.Regexp(t, dbtest.Index("outbox_messages_pending_idx"), plan)
	require.Regexp(t, dbtest.Index("outbox_messages_pkey"), plan, "the claimed rows are updated by primary key")
}

// claimGenericPlan is the plan, analyzed, of dest's claim of up to batch
// messages under the lease token, as the relay runs it: generic.
func claimGenericPlan(t *testing.T, pool *pgxpool.Pool, trace *dbtest.Statements, token, dest uuid.UUID, batch int32) string {
	t.Helper()
	trace.Explain(t, pool, queries(func(q *outboxdb.Queries) error {
		_, err := q.MessageClaim(context.Background(), outboxdb.MessageClaimParams{ClaimToken: token, RelayID: uuid.New(), Destination: dest, BatchSize: batch})
		return err
	}))
	plan := trace.ExplainGeneric(t, pool)
	t.Logf("claim, generic plan:\n%s", plan)
	return plan
}

// A claim updates what it claimed by primary key, and = ANY of an array
// known only at run time prunes no partition: without the range of ids
// beside it, every claim would probe each retained day's primary key for
// each of its rows, and a steady state's week of history would cost every
// claim a week of failed lookups. The day of delivered history here is
// never read by the claim's update. It is one update, claiming and
// parking: each update of the partitioned table sets up every partition as
// the statement starts.
func TestClaimUpdatesOnlyThePartitionsOfItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	outboxtest.PartitionsSince(t, pool, time.Now().Add(-3*24*time.Hour))
	token := uuid.New()
	dest := outboxtest.Endpoint(t, pool, &token)
	history := deliveredHistory(t, pool, dest, 20000)
	outboxtest.Seed(t, pool, dest, 500, "")
	for k := range 5 {
		outboxtest.Seed(t, pool, dest, 2, fmt.Sprintf("order-%d", k)) // some parked, the rest claimed
	}
	_, err := pool.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	plan := claimGenericPlan(t, pool, trace, token, dest, 600)
	updateScan := regexp.MustCompile(`Scan (on|using \S+ on) outbox_messages_\S+ m_\d+ `)
	read := 0
	for _, line := range strings.Split(plan, "\n") {
		// The update's scans of the history (aliased m_N) and its primary
		// key. The due rows are read on the pending index and what stands
		// ahead of a key on the ordering index, of every partition, as
		// they must be: both are empty here.
		if updateScan.MatchString(line) && strings.Contains(line, "outbox_messages_"+history+" m_") ||
			strings.Contains(line, "outbox_messages_"+history+"_pkey") {
			read++
			require.Contains(t, line, "(never executed)", "a claim's update reads the day of history its rows are not in")
		}
	}
	require.GreaterOrEqual(t, read, 1, "the plan has the history partition under the update")
	require.Equal(t, 1, strings.Count(plan, "Update on outbox_messages m "), "one update claims and parks:\n%s", plan)
}

// A recording updates its messages by primary key, and so = ANY of an
// array, as the claim does; the range of its ids, passed beside them as
// parameters, leaves the other partitions out as the statement starts,
// where a range known only at run time (the claim's) leaves them opened
// and skipped. One outcome, the end of a job of one order fanned out to
// thousands of endpoints, spent most of its time opening a dozen
// partitions. The day of delivered history here is not in the plan.
func TestARecordingOpensOnlyThePartitionsOfItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	outboxtest.PartitionsSince(t, pool, time.Now().Add(-3*24*time.Hour))
	token := uuid.New()
	dest := outboxtest.Endpoint(t, pool, &token)
	history := deliveredHistory(t, pool, dest, 1000)
	ids := outboxtest.Seed(t, pool, dest, 2, "")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = $1, claimed_at = now()
		WHERE id = ANY ($2)`, token, ids)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	rec := newRecorder(defaultRelay(t, pool, slog.New(slog.DiscardHandler)), dest, token)
	now := time.Now()
	var outcomes []outcome
	for _, id := range ids {
		outcomes = append(outcomes, outcome{id: id, attempt: 1, status: outbox.StatusDelivered, label: labelDelivered,
			code: 204, started: now, finished: now, eventAt: now})
	}
	trace.Explain(t, pool, queries(func(q *outboxdb.Queries) error {
		rows, err := q.MessagesRecordOutcomes(ctx, rec.params(outcomes))
		require.Len(t, rows, len(ids), "both outcomes recorded")
		return err
	}))
	plan := trace.ExplainGeneric(t, pool)
	t.Logf("recording, generic plan:\n%s", plan)
	require.Contains(t, plan, "Subplans Removed", "partitions left out as the statement starts")
	// The update names every partition it may write; it scans only its rows'.
	require.NotRegexp(t, `Scan (on|using \S+ on) outbox_messages_`+history, plan,
		"the recording opens the day of history its rows are not in")
}

// deliveredHistory writes n delivered messages of dest two days back, all
// in that day's partition (made by outboxtest.PartitionsSince), and
// returns the partition's suffix.
func deliveredHistory(t *testing.T, pool *pgxpool.Pool, dest uuid.UUID, n int) string {
	t.Helper()
	ctx := context.Background()
	var history string
	require.NoError(t, pool.QueryRow(ctx, `SELECT suffix FROM outbox_partitions()
		WHERE outbox_uuid_at(now() - interval '2 days') >= lo AND outbox_uuid_at(now() - interval '2 days') < hi`).Scan(&history))
	_, err := pool.Exec(ctx, `INSERT INTO outbox_messages (id, event_id, type, destination, status, delivered_at)
		SELECT outbox_uuid_sibling(outbox_uuid_at(now() - interval '2 days')), outbox_uuid_v7(), 'order.placed', $1,
		       'delivered', now() - interval '2 days'
		FROM generate_series(1, $2::int)`, dest, n)
	require.NoError(t, err)
	return history
}

// A claim reads a few entries of one destination's index, however many
// messages wait behind them, but PostgreSQL decides whether to JIT-compile a
// statement from the planner's cost estimate, and the claim's estimate
// follows its destination's backlog (the generic plan takes its LIMIT as a
// tenth of the rows). With a few hundred thousand messages waiting for one
// endpoint, a connection at the server's defaults compiles every claim
// before running it. The product's pools (db.ConfigurePool) turn JIT off:
// their claims cost what they read.
func TestClaimDoesNotCompileForABacklog(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	var jit string
	require.NoError(t, pool.QueryRow(ctx, `SHOW jit`).Scan(&jit))
	require.Equal(t, "off", jit, "the product's pool")

	// The same database at the server's defaults, as a pool without
	// db.ConfigurePool sees it.
	cfg := pool.Config().Copy()
	delete(cfg.ConnConfig.RuntimeParams, "jit")
	cfg.AfterConnect = nil
	serverDefaults, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(serverDefaults.Close)
	var available bool // a provider is installed and jit is on
	require.NoError(t, serverDefaults.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available))
	if !available {
		t.Skip("this PostgreSQL does not JIT-compile at its defaults: there is nothing to turn off")
	}

	lease := uuid.New()
	dest := outboxtest.Endpoint(t, pool, &lease)
	outboxtest.Seed(t, pool, dest, 500_000, "")
	_, err = pool.Exec(ctx, `ANALYZE outbox_messages`) // as autovacuum would
	require.NoError(t, err)

	// Claims of 32, rolled back so each finds the same backlog; medians of
	// 7, the two pools alternating.
	claim := func(p *pgxpool.Pool) time.Duration {
		tx, err := p.Begin(ctx)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback(ctx)) }()
		start := time.Now()
		rows, err := claimMessages(ctx, tx, outboxdb.MessageClaimParams{
			ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 32})
		took := time.Since(start)
		require.NoError(t, err)
		require.Len(t, rows, 32)
		return took
	}
	var product, defaults []time.Duration
	for range 7 {
		product = append(product, claim(pool))
		defaults = append(defaults, claim(serverDefaults))
	}
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("claim of 32 with 500,000 waiting: %s on the product's pool, %s at the server's defaults", median(product), median(defaults))
	require.Less(t, 5*median(product), median(defaults),
		"the product's claim must cost a fraction of one compiled for the backlog (if not, the server does not JIT this claim and the test shows nothing)")
}

// A claim released at the attempt cap, because its relay died or its
// claim went stale (MessagesReleaseLost), fails like any other message:
// with failed_at, so the failed retention prunes it. Without it the row,
// its event and its history stayed forever.
func TestMessagesFailedByAReleaseArePrunedWithTheFailed(t *testing.T) {
	t.Parallel()
	pool, dest, ids := seededEndpoint(t, 2, "")
	ctx := context.Background()
	dead, stale := ids[0], ids[1]
	const maxAttempts = 3
	q := outboxdb.New(pool)
	// Both claimed at their last attempt: one by a relay now gone, one an
	// hour ago by a relay still alive with a claim timeout of a minute.
	alive := uuid.New()
	_, err := q.RelayRegister(ctx, outboxdb.RelayRegisterParams{ID: alive, Hostname: "h", Pid: 1, TimeoutSeconds: 5,
		ClaimTimeoutSeconds: time.Minute.Seconds()})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', attempts = $2 - 1, claim_token = gen_random_uuid(),
		claimed_by = CASE WHEN id = $3 THEN gen_random_uuid() ELSE $4 END,
		claimed_at = CASE WHEN id = $3 THEN now() ELSE now() - interval '1 hour' END
		WHERE id = ANY ($1)`, ids, maxAttempts, dead, alive)
	require.NoError(t, err)

	rows, err := q.MessagesReleaseLost(ctx, dest, maxAttempts)
	require.NoError(t, err)
	require.Len(t, rows, 2, "the gone relay's claim and the stale one")
	for _, id := range ids {
		var status, outcome string
		var failedAt *time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT m.status, m.failed_at, a.outcome FROM outbox_messages m
			JOIN outbox_attempts a ON a.message_id = m.id WHERE m.id = $1`, id).Scan(&status, &failedAt, &outcome))
		require.Equal(t, outbox.StatusFailed, status, "released at the cap: failed")
		require.NotNil(t, failedAt, "a failed message has failed_at")
		require.Equal(t, labelFailed, outcome, "its attempt is the failed one, as any at the cap")
	}
	// The activity's minute sums count them as failed, not retried.
	var sums int
	require.NoError(t, pool.QueryRow(ctx, "SELECT coalesce(sum(attempts), 0) FROM outbox_attempt_minutes WHERE destination = $1 AND outcome = 'failed'", dest).Scan(&sums))
	require.Equal(t, 2, sums)

	pruned, err := q.MessagesPruneFailed(ctx, dest, time.Now().Add(time.Minute), 100)
	require.NoError(t, err)
	require.Len(t, pruned, 2, "the failed retention prunes both, %v and %v", dead, stale)
}

// An interrupted request is an attempt (it may have reached the receiver):
// at the attempt cap the message fails, as a dead relay's claims do, rather
// than staying pending past its cap.
func TestAnInterruptedRequestAtTheCapFails(t *testing.T) {
	t.Parallel()
	cfg := Config{MaxAttempts: 3}.withDefaults()
	interrupted := func(attempts int) outcome {
		return cfg.judge(uuid.New(), "", attempts, Result{Err: context.Canceled}, true, time.Now(), time.Now())
	}
	o := interrupted(1)
	require.Equal(t, outbox.StatusPending, o.status, "attempt 2 of 3: due again")
	require.Equal(t, labelInterrupted, o.label)
	o = interrupted(2)
	require.Equal(t, outbox.StatusFailed, o.status, "attempt 3 of 3: failed")
	require.Equal(t, labelFailed, o.label, "its attempt is the failed one, as any at the cap")
	require.Equal(t, "attempt 3 of 3: interrupted: the relay stopped during the request", o.err)
}

// A transport failure backs the destination off unless the transport says
// it is the message's own (too large for the broker): then, as a 413, it
// is retried and fails alone while the destination's other messages go.
func TestAMessageFaultDoesNotCountAgainstTheDestination(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	tooLarge := Result{Err: errors.New("message size exceeds maximum allowed"), MessageFault: true}
	o := cfg.judge(uuid.New(), "", 0, tooLarge, false, time.Now(), time.Now())
	require.Equal(t, signalNone, signalOf(tooLarge, false), "says nothing of the destination")
	require.Equal(t, outbox.StatusPending, o.status, "retried, as any failed attempt below the cap")
	require.Equal(t, labelRefused, o.label)
	require.Equal(t, tooLarge.Err.Error(), o.err)
	require.Equal(t, signalRefused, signalOf(Result{Err: errors.New("connection refused")}, false),
		"any other transport failure is the destination's")
}

// What a job claimed without seeing it (its claim statement failed on the
// way back, after committing) goes back to pending at the job's end as it
// was: no attempt charged, and nobody else's claims touched.
func TestMessagesReleaseByTokenReleasesOnlyTheJobsClaims(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	dest := outboxtest.Endpoint(t, pool, nil)
	ids := outboxtest.Seed(t, pool, dest, 3, "")
	mine, other := uuid.New(), uuid.New()
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', attempts = 1, claimed_at = now(), claimed_by = gen_random_uuid(),
		claim_token = CASE WHEN id = $2 THEN $4::uuid ELSE $3::uuid END WHERE id = ANY ($1)`, ids, ids[2], mine, other)
	require.NoError(t, err)

	keys, err := outboxdb.New(pool).MessagesReleaseByToken(ctx, mine)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	for i, id := range ids {
		var status string
		var attempts int
		require.NoError(t, pool.QueryRow(ctx, "SELECT status, attempts FROM outbox_messages WHERE id = $1", id).Scan(&status, &attempts))
		require.Equal(t, 1, attempts, "no attempt charged")
		if i < 2 {
			require.Equal(t, outbox.StatusPending, status, "the job's claim is released")
		} else {
			require.Equal(t, outbox.StatusClaimed, status, "another job's claim is not")
		}
	}
}

// A claim that parks a keyed message behind the one ahead of it (in
// flight), and the recording of that one's delivery, run at once: the
// recording's promotion waits for the destination's lock the claim holds,
// then sees what the claim parked, and lets it go. Before the lock each
// statement saw the database as it was when it began, and the message
// stayed parked with nothing ahead of it until a sweep found it.
func TestAClaimBesideARecordingStrandsNothing(t *testing.T) {
	t.Parallel()
	k := keyedPair(t)
	ctx := context.Background()
	first := k.claim(k.pool, 1)
	require.Len(t, first, 1, "the first of the key is claimed and sent")

	// The next claim parks the second, and has not committed yet when the
	// recording of the first's delivery runs.
	tx, err := k.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.Empty(t, k.claim(tx, 10), "the second waits behind the first, still claimed")
	recorded := make(chan error, 1)
	go func() { recorded <- k.record(first[0], Result{StatusCode: http.StatusNoContent}) }()
	waitForALockWait(t, k.pool, "the recording waits for the lock the claim holds")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-recorded)
	require.False(t, k.parked(), "the recording, after the claim, let the second go")
	rows := k.claim(k.pool, 10)
	require.Len(t, rows, 1)
	require.Equal(t, k.next, rows[0].ID, "and the next claim sends it")
}

// pair is two messages of the ordering key "order-1" to one destination,
// whose lease the test holds.
type pair struct {
	t           *testing.T
	pool        *pgxpool.Pool
	dest, lease uuid.UUID
	ahead, next uuid.UUID
}

func keyedPair(t *testing.T) pair {
	k := pair{t: t}
	k.pool, k.dest, k.lease = leased(t)
	ids := outboxtest.Seed(t, k.pool, k.dest, 2, "order-1")
	k.ahead, k.next = ids[0], ids[1]
	return k
}

// claim claims up to n of the destination's due messages on db, as the
// lease holder.
func (k pair) claim(db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, n int32) []outboxdb.MessageClaimRow {
	rows, err := claimMessages(context.Background(), db, outboxdb.MessageClaimParams{
		ClaimToken: k.lease, RelayID: uuid.New(), Destination: k.dest, BatchSize: n})
	require.NoError(k.t, err)
	return rows
}

// record writes what came of a claimed row's request as a deliver job's
// recorder does: its outcome, then its key promoted, under the
// destination's lock.
func (k pair) record(row outboxdb.MessageClaimRow, res Result) error {
	r := &Relay{cfg: DefaultConfig(), pool: k.pool}
	rc := newRecorder(r, k.dest, k.lease)
	now := time.Now()
	rc.record(r.cfg.judge(row.ID, orEmpty(row.OrderingKey), int(row.Attempts), res, false, now, now))
	var recorded []outcome
	return rc.write(context.Background(), k.pool, rc.pending, &recorded)
}

// parked is whether the second message is parked.
func (k pair) parked() bool {
	var p bool
	require.NoError(k.t, k.pool.QueryRow(context.Background(), "SELECT parked FROM outbox_messages WHERE id = $1", k.next).Scan(&p))
	return p
}

// leased is a database with one endpoint whose lease the test holds.
func leased(t *testing.T) (pool *pgxpool.Pool, dest, lease uuid.UUID) {
	pool, lease = dbtest.Pool(t), uuid.New()
	return pool, outboxtest.Endpoint(t, pool, &lease), lease
}

// seededEndpoint is a database with one endpoint nothing listens on and n
// pending messages for it (of one ordering key, unless key is empty).
func seededEndpoint(t *testing.T, n int, key string) (pool *pgxpool.Pool, ep uuid.UUID, ids []uuid.UUID) {
	pool = dbtest.Pool(t)
	ep = outboxtest.Endpoint(t, pool, nil)
	return pool, ep, outboxtest.Seed(t, pool, ep, n, key)
}

// A recovery brings forward the messages the outage sent into a later
// retry, not one a broker refused on its own (too large): that one keeps
// its schedule. Both were recorded as "retry" with no status code, and the
// recovery made the refused message due at once, to be refused again.
func TestRecoveryLeavesAMessageRefusedOnItsOwnOnItsSchedule(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	outboxtest.Seed(t, pool, dest, 2, "")
	rows, err := claimMessages(ctx, pool, outboxdb.MessageClaimParams{
		ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 2})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	rc := newRecorder(&Relay{cfg: DefaultConfig()}, dest, lease)
	refused := judged(rc.r.cfg, rows[0], Result{Err: errors.New("message size exceeds maximum allowed"), MessageFault: true})
	unreachable := judged(rc.r.cfg, rows[1], Result{Err: errors.New("connection refused")})
	_, err = outboxdb.New(pool).MessagesRecordOutcomes(ctx, rc.params([]outcome{refused, unreachable}))
	require.NoError(t, err)

	n, err := outboxdb.New(pool).MessagesBringForward(ctx, dest, lease)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "one message brought forward")
	var due uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE destination = $1 AND next_attempt_at <= now()`,
		dest).Scan(&due))
	require.Equal(t, rows[1].ID, due, "the one the outage held back")
}

// An outcome recorded twice (its recording committed with the answer lost,
// so the job put it back and flushed it again) changes nothing the second
// time, even when the same job has meanwhile claimed the message again for
// its retry: matched on the job's token alone, the old outcome settled the
// new claim, with its request still in flight, and a third request went out
// beside it.
func TestAnOutcomeRecordedAgainLeavesALaterClaimAlone(t *testing.T) {
	t.Parallel()
	pool, _, rc, claim := oneLeasedMessage(t)
	ctx := context.Background()
	first := judged(rc.r.cfg, claim(), Result{StatusCode: 503})
	first.delay = 0 // due again at once, within the job
	record := func(o outcome) int {
		rows, err := outboxdb.New(pool).MessagesRecordOutcomes(ctx, rc.params([]outcome{o}))
		require.NoError(t, err)
		return len(rows)
	}
	require.EqualValues(t, 1, record(first))

	again := claim()
	require.EqualValues(t, 1, again.Attempts)
	require.Zero(t, record(first), "the first outcome, put back, is recorded already")
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE id = $1`, again.ID).Scan(&status))
	require.Equal(t, outbox.StatusClaimed, status, "the second claim stands")
	require.EqualValues(t, 1, record(judged(rc.r.cfg, again, Result{StatusCode: 204})))
	var outcomes []string
	rows, err := pool.Query(ctx, `SELECT outcome FROM outbox_attempts WHERE message_id = $1 ORDER BY attempt`, again.ID)
	require.NoError(t, err)
	outcomes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{labelRetry, labelDelivered}, outcomes)
}

// A request cut off by a stop is no answer from the receiver, on its last
// attempt too (judged "failed" there): the destination's failures and its
// probe stay as they were, so a circuit no receiver answered stays open.
func TestAnInterruptedLastAttemptSaysNothingOfTheDestination(t *testing.T) {
	t.Parallel()
	cfg := Config{MaxAttempts: 3}.withDefaults()
	res := Result{Err: context.Canceled}
	o := cfg.judge(uuid.New(), "", 2, res, true, time.Now(), time.Now())
	require.Equal(t, labelFailed, o.label, "at the cap the message fails")
	sig := signalOf(res, true)
	require.Equal(t, signalNone, sig)
	p := newPace(cfg, outboxdb.DestinationLeaseRow{Health: outbox.HealthBackingOff, ConsecutiveFailures: 4})
	require.False(t, p.answer(sig, p.send(), 1, time.Time{}, o.err))
	require.Equal(t, 4, p.failures, "no answer: the failures in a row stand")
	require.Equal(t, stateProbing, p.state, "no answer: still probing, the probe neither failed nor answered")
	require.Equal(t, 1, p.room(0), "and the next probe may go")
}

// An outcome recorded already and put back (its answer lost) may be flushed
// in one batch with the message's next outcome: only the next one is
// recorded, and it alone is added to the minute's sums and to the
// endpoint's latest attempt. Joined on the message alone, the old outcome
// rode along and was counted twice.
func TestAnOutcomeRecordedAgainBesideTheNextIsCountedOnce(t *testing.T) {
	t.Parallel()
	pool, dest, rc, claim := oneLeasedMessage(t)
	ctx := context.Background()
	start := time.Now()
	first := judged(rc.r.cfg, claim(), Result{StatusCode: 503})
	first.started, first.finished, first.delay = start, start.Add(time.Millisecond), 0
	n, err := outboxdb.New(pool).MessagesRecordOutcomes(ctx, rc.params([]outcome{first}))
	require.NoError(t, err)
	require.Len(t, n, 1)

	// The first outcome put back, then flushed with the retry's.
	second := judged(rc.r.cfg, claim(), Result{StatusCode: 204})
	second.started, second.finished = start, start.Add(2*time.Millisecond)
	first.finished = start.Add(3 * time.Millisecond) // were it taken, it would be the latest
	n, err = outboxdb.New(pool).MessagesRecordOutcomes(ctx, rc.params([]outcome{first, second}))
	require.NoError(t, err)
	require.Len(t, n, 1, "the retry's outcome alone")

	sums := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT outcome, sum(attempts)::int FROM outbox_attempt_minutes WHERE destination = $1 GROUP BY outcome`, dest)
	require.NoError(t, err)
	for rows.Next() {
		var outcome string
		var n int
		require.NoError(t, rows.Scan(&outcome, &n))
		sums[outcome] = n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{labelRetry: 1, labelDelivered: 1}, sums, "one attempt each, as the history holds")
	var latest string
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_attempt_outcome FROM webhook_endpoints WHERE id = $1`, dest).Scan(&latest))
	require.Equal(t, labelDelivered, latest, "the endpoint's latest attempt is the one recorded")
}

// A claim goes stale after its own relay's claim timeout, not the timeout
// of whichever relay looks: during a rollout that shortens
// OUTBOX_CLAIM_TIMEOUT, a new relay would otherwise release an old one's
// claims with their requests still in flight, and they would be sent
// twice. A claim whose relay is not registered is lost at once: its relay
// is not alive.
func TestAClaimGoesStaleAfterItsOwnRelaysClaimTimeout(t *testing.T) {
	t.Parallel()
	pool, _, ids := seededEndpoint(t, 2, "")
	ctx := context.Background()
	q := outboxdb.New(pool)
	patient := uuid.New()
	_, err := q.RelayRegister(ctx, outboxdb.RelayRegisterParams{ID: patient, Hostname: "old", Pid: 1, TimeoutSeconds: 5,
		ClaimTimeoutSeconds: (10 * time.Minute).Seconds()})
	require.NoError(t, err)
	// Both claimed two minutes ago: one by the patient relay, one by a
	// relay nobody knows.
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(),
		claimed_by = CASE WHEN id = $2 THEN $3 ELSE gen_random_uuid() END, claimed_at = now() - interval '2 minutes'
		WHERE id = ANY ($1)`, ids, ids[0], patient)
	require.NoError(t, err)

	dests, err := q.ClaimsLostDestinations(ctx)
	require.NoError(t, err)
	require.Len(t, dests, 1)
	n, err := q.MessagesReleaseLost(ctx, dests[0], 8)
	require.NoError(t, err)
	require.Len(t, n, 1, "the unknown relay's claim: its relay is not alive")
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE id = $1`, ids[0]).Scan(&status))
	require.Equal(t, outbox.StatusClaimed, status, "within its own relay's 10 minutes, the claim stands")
}

// A 410 on a message's last attempt pauses the endpoint and leaves the
// message waiting, so once enabled it has one more try, past the cap: its
// error says so rather than "attempt 4 of 3".
func TestAnAttemptPastTheCapSaysWhy(t *testing.T) {
	t.Parallel()
	cfg := Config{MaxAttempts: 3}.withDefaults()
	gone := judged(cfg, outboxdb.MessageClaimRow{Attempts: 2}, Result{StatusCode: http.StatusGone})
	require.Equal(t, outbox.StatusPending, gone.status, "a 410 on the last attempt: the message waits with its paused endpoint")
	o := judged(cfg, outboxdb.MessageClaimRow{Attempts: 3}, Result{StatusCode: http.StatusInternalServerError})
	require.Equal(t, outbox.StatusFailed, o.status)
	require.Equal(t, "attempt 4, past the cap of 3: 500 Internal Server Error", o.err)
	o = judged(cfg, outboxdb.MessageClaimRow{Attempts: 2}, Result{StatusCode: http.StatusInternalServerError})
	require.Equal(t, "attempt 3 of 3: 500 Internal Server Error", o.err)
}

// oneLeasedMessage is a destination with one message, the recorder of a
// deliver job holding its lease, and claim, which claims the message as
// the job does.
func oneLeasedMessage(t *testing.T) (pool *pgxpool.Pool, dest uuid.UUID, rc *recorder, claim func() outboxdb.MessageClaimRow) {
	pool, dest, lease := leased(t)
	outboxtest.Seed(t, pool, dest, 1, "")
	rc = newRecorder(&Relay{cfg: DefaultConfig()}, dest, lease)
	return pool, dest, rc, func() outboxdb.MessageClaimRow {
		t.Helper()
		rows, err := claimMessages(context.Background(), pool, outboxdb.MessageClaimParams{
			ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: 1})
		require.NoError(t, err)
		require.Len(t, rows, 1)
		return rows[0]
	}
}

// A Retry-After shorter than the message's own schedule holds the
// destination back that long, but the message still waits its schedule: a
// receiver answering 503 with Retry-After: 1 made each message due a second
// later, so one message spent its eight attempts in under a minute of an
// outage (the circuit's probes take the oldest due message) and was
// `failed` where the schedule would have lasted 27.6 hours. A longer
// Retry-After pushes the message back too.
func TestAShortRetryAfterDoesNotShortenTheRetrySchedule(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	for attempt, want := range cfg.RetrySchedule[:4] {
		for _, code := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
			res := Result{StatusCode: code, RetryAfter: time.Second}
			o := judged(cfg, outboxdb.MessageClaimRow{Attempts: int32(attempt)}, res)
			require.Equal(t, signalWait, signalOf(res, false), "the destination waits what the receiver asked")
			require.Equal(t, time.Second, retryAfter(res))
			require.GreaterOrEqual(t, o.delay, want*9/10, "attempt %d answered %d: the message waits its schedule", attempt+1, code)
		}
	}
	o := judged(cfg, outboxdb.MessageClaimRow{Attempts: 0}, Result{StatusCode: http.StatusServiceUnavailable, RetryAfter: 2 * time.Hour})
	require.Equal(t, 2*time.Hour, o.delay, "a Retry-After beyond the schedule's wait is honoured")
}

// A transport's refusal of one message (too large) may come from the
// client alone, which knows the server's limit without reaching it (nats.go
// checks its cached max_payload even while reconnecting; franz-go a record
// against the batch limit): it says nothing of the destination. Taken for an
// answer, it reset the failures in a row and, when probing, closed the
// circuit of a broker that was down, bringing every retry forward against it.
func TestATransportsOwnRefusalSaysNothingOfTheDestination(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	res := Result{Err: errors.New("nats: maximum payload exceeded"), MessageFault: true}
	o := judged(cfg, outboxdb.MessageClaimRow{Attempts: 1}, res)
	require.Equal(t, labelRefused, o.label, "the message is refused and retried on its own schedule")
	for _, health := range []string{outbox.HealthHealthy, outbox.HealthBackingOff} {
		p := newPace(cfg, outboxdb.DestinationLeaseRow{Health: health, ConsecutiveFailures: 4})
		before := p.state
		p.answer(signalOf(res, false), p.send(), 1, time.Time{}, o.err)
		require.Equal(t, 4, p.failures, "no answer: the failures in a row stand (%s)", health)
		require.Equal(t, before, p.state, "no answer: a probe goes on, a circuit stays as it was (%s)", health)
	}
}

// judged is what comes of a request for row that ended with res.
func judged(cfg Config, row outboxdb.MessageClaimRow, res Result) outcome {
	now := time.Now()
	return cfg.judge(row.ID, orEmpty(row.OrderingKey), int(row.Attempts), res, false, now, now)
}

// queries runs run on the queries of the transaction it is given.
func queries(run func(*outboxdb.Queries) error) func(pgx.Tx) error {
	return func(tx pgx.Tx) error { return run(outboxdb.New(tx)) }
}

// A person's skip of a failed head beside a claim of the next message of
// its key, in either order, lets that message go: the skip takes the
// destination's lock before its change, as the claim does, so one waits
// for the other and sees what it committed. Before, the claim read the
// head as failed and parked the message while the skip, unseen, promoted
// nothing: the message waited for a sweep, an hour at worst.
func TestASkipBesideAClaimStrandsNothing(t *testing.T) {
	t.Parallel()
	failHead := func(k pair) {
		_, err := k.pool.Exec(context.Background(), `UPDATE outbox_messages
			SET status = 'failed', attempts = 3, failed_at = now(), last_error = 'refused' WHERE id = $1`, k.ahead)
		require.NoError(k.t, err)
	}
	t.Run("the claim first", func(t *testing.T) {
		t.Parallel()
		k := keyedPair(t)
		failHead(k)
		ctx := context.Background()
		claim, err := k.pool.Begin(ctx)
		require.NoError(t, err)
		defer claim.Rollback(ctx) //nolint:errcheck
		require.Empty(t, k.claim(claim, 10), "the claim parks the next message behind the failed head")
		adm := admin.New(k.pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
		skipped := make(chan error, 1)
		go func() {
			_, err := adm.Skip(ctx, k.ahead)
			skipped <- err
		}()
		waitForALockWait(t, k.pool, "the skip waits for the claim's lock")
		require.NoError(t, claim.Commit(ctx))
		require.NoError(t, <-skipped)
		require.False(t, k.parked(), "the skip, after the claim, let the parked message go")
		rows := k.claim(k.pool, 10)
		require.Len(t, rows, 1)
		require.Equal(t, k.next, rows[0].ID)
	})
	t.Run("the skip first", func(t *testing.T) {
		t.Parallel()
		k := keyedPair(t)
		failHead(k)
		ctx := context.Background()
		skip, err := k.pool.Begin(ctx)
		require.NoError(t, err)
		defer skip.Rollback(ctx) //nolint:errcheck
		q := outboxdb.New(skip)
		require.NoError(t, q.DestinationLock(ctx, k.dest))
		_, err = q.MessageSkip(ctx, "skipped by an operator", k.ahead)
		require.NoError(t, err)
		claimed := make(chan []outboxdb.MessageClaimRow, 1)
		go func() { claimed <- k.claim(k.pool, 10) }()
		waitForALockWait(t, k.pool, "the claim waits for the skip's lock")
		require.NoError(t, skip.Commit(ctx))
		rows := <-claimed
		require.Len(t, rows, 1, "the claim, after the skip, finds nothing ahead")
		require.Equal(t, k.next, rows[0].ID)
	})
}
