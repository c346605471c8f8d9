package relay

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A message retried after its receiver asked to wait is counted, from its
// event's writing to its delivery, with the whole wait: the histogram and
// the per-minute sums the ops page reads both put it at least as late as
// the gap between its two requests, which the receiver measured itself,
// and the gap is the 5 seconds or more the receiver asked for.
func TestTheDeliveryLagCountsARetrysWholeWait(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()

	var (
		mu       sync.Mutex
		requests []time.Time
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, time.Now())
		if len(requests) == 1 {
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(receiver.Close)
	var ep uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ($1, 'whsec_AAAA', '{order.placed}') RETURNING id`, receiver.URL).Scan(&ep))
	written := time.Now()
	outboxtest.Seed(t, pool, ep, 1, "")

	r := startRelay(t, pool, nil)
	require.Eventually(t, func() bool {
		var delivered bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT status = 'delivered' FROM outbox_messages WHERE destination = $1`, ep).Scan(&delivered))
		return delivered
	}, 30*time.Second, 50*time.Millisecond)

	mu.Lock()
	require.Len(t, requests, 2, "refused once, delivered at the retry")
	gap := requests[1].Sub(requests[0])
	mu.Unlock()
	require.GreaterOrEqual(t, gap, 5*time.Second, "the retry waited as asked")

	h := histogram(t, r.metrics.deliveryLag.WithLabelValues("webhook", "delivered"))
	require.EqualValues(t, 1, h.GetSampleCount(), "one delivery observed")
	require.GreaterOrEqual(t, h.GetSampleSum(), gap.Seconds(), "its lag holds the retry's wait")
	require.Less(t, h.GetSampleSum(), time.Since(written).Seconds(), "and no more than since its event was written")
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() < 5 {
			require.Zero(t, b.GetCumulativeCount(), "nothing in the buckets under 5 s (le %g)", b.GetUpperBound())
		}
	}
	eh := histogram(t, r.metrics.byEndpointLag.WithLabelValues(ep.String(), "delivered"))
	require.Equal(t, h.GetSampleSum(), eh.GetSampleSum(), "the endpoint's histogram has the same delivery")

	var deliveries int64
	var minMS, maxMS float64
	var le int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(deliveries), min(min_ms), max(max_ms), max(le_ms)
		FROM outbox_delivery_lag_minutes WHERE destination = $1`, ep).Scan(&deliveries, &minMS, &maxMS, &le))
	require.EqualValues(t, 1, deliveries, "one delivery in the minute sums")
	require.Equal(t, minMS, maxMS, "one delivery: its quickest is its latest")
	require.GreaterOrEqual(t, minMS, float64(gap.Milliseconds()), "the sums hold the retry's wait too")
	require.InDelta(t, h.GetSampleSum()*1000, minMS, 50, "the histogram and the sums measure the same lag")
	require.Greater(t, float64(le), minMS, "in the bucket whose bound is above it")
}

func histogram(t *testing.T, o prometheus.Observer) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	require.NoError(t, o.(prometheus.Metric).Write(&m))
	return m.GetHistogram()
}

// A database that records outcomes slower than the receiver answers slows
// the job to the recording's pace: it stops claiming while hundreds of
// outcomes wait to be written, rather than claiming (and sending) the
// whole backlog, with a write of thousands left for its end, one that
// outlived its timeout and was retried, ever slower, for ever. Here the
// recording waits on a lock for four seconds while 5,000 messages are due
// to a receiver that answers at once: what is claimed stays under the
// outcomes let wait and the most claimed ahead (before the gate, it
// reached 917 in two seconds, and went on to the whole backlog).
func TestASlowRecordingHoldsBackTheClaims(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	var received atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { received.Add(1) }))
	t.Cleanup(receiver.Close)
	var ep uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ($1, 'whsec_AAAA', '{order.placed}') RETURNING id`, receiver.URL).Scan(&ep))
	const backlog = 5000
	outboxtest.Seed(t, pool, ep, backlog, "")

	// The attempt history's table locked: every recording waits.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck
	_, err = lock.Exec(ctx, `LOCK TABLE outbox_attempts IN EXCLUSIVE MODE`)
	require.NoError(t, err)

	startRelay(t, pool, nil)
	var waiting bool
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'outbox_attempts'::regclass AND NOT granted)`).Scan(&waiting))
		return waiting
	}, 10*time.Second, 10*time.Millisecond, "a recording waits on the lock")
	// Four seconds at the receiver's pace would send thousands.
	bound := unrecordedMax + maxLead*windowsAhead*DefaultConfig().DestinationConcurrency
	deadline := time.Now().Add(4 * time.Second)
	var claimed, most int
	for time.Now().Before(deadline) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'claimed'`).Scan(&claimed))
		most = max(most, claimed)
		require.LessOrEqual(t, claimed, bound, "claimed no further than the outcomes waiting to be written allow")
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("at most %d claimed, %d sent", most, received.Load())
	require.LessOrEqual(t, received.Load(), int64(bound), "and sent no more")

	require.NoError(t, lock.Rollback(ctx))
	require.Eventually(t, func() bool {
		var delivered int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`).Scan(&delivered))
		return delivered == backlog
	}, 60*time.Second, 50*time.Millisecond, "the backlog drains once the recording goes on")
}

// Recording is linear in its outcomes: no step of its statement compares
// every outcome with every other. With 3,000 outcomes at once (a job's
// end after a slow stretch), its plan removes no more rows in joins than
// it records. Each step once joined the updated rows with the outcomes
// again; the planner, which cannot know how many either holds, made the
// lag's step a nested loop that compared 6,000,000 pairs (5,998,000
// rows removed by its join filter here).
func TestRecordingIsLinearInItsOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	dest, lease := outboxtest.Endpoint(t, pool, nil), uuid.New()
	_, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET lease_token = $2 WHERE id = $1`, dest, lease)
	require.NoError(t, err)
	const n = 3000
	outboxtest.Seed(t, pool, dest, n, "")
	rows, err := claimMessages(ctx, pool, outboxdb.MessageClaimParams{ClaimToken: lease, RelayID: uuid.New(), Destination: dest, BatchSize: n})
	require.NoError(t, err)
	require.Len(t, rows, n)
	rc := newRecorder(&Relay{cfg: DefaultConfig()}, dest, lease)
	var outcomes []outcome
	now := time.Now()
	for i, row := range rows {
		res := Result{StatusCode: http.StatusNoContent}
		if i%3 == 0 {
			res = Result{StatusCode: http.StatusInternalServerError}
		}
		o := rc.r.cfg.judge(row.ID, "", int(row.Attempts), res, false, now, now)
		o.eventAt = row.CreatedAt
		outcomes = append(outcomes, o)
	}
	// The statement as the recorder sends it, rolled back, then explained.
	sql, args := trace.One(t, func() error {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := outboxdb.New(tx).MessagesRecordOutcomes(ctx, rc.params(outcomes)); err != nil {
				return err
			}
			return dbtest.ErrRollback
		})
		if errors.Is(err, dbtest.ErrRollback) {
			return nil
		}
		return err
	})
	var plan string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		plan = strings.Join(dbtest.PlanLines(t, tx, "EXPLAIN (ANALYZE) "+sql, args...), "\n")
		return dbtest.ErrRollback
	})
	require.ErrorIs(t, err, dbtest.ErrRollback)
	require.Contains(t, plan, "rows="+strconv.Itoa(n)+" loops=1", "the explained run recorded them all:\n%s", plan)
	for _, m := range regexp.MustCompile(`Rows Removed by Join Filter: (\d+)`).FindAllStringSubmatch(plan, -1) {
		removed, _ := strconv.Atoi(m[1])
		require.LessOrEqual(t, removed, n, "a join compares outcomes pairwise:\n%s", plan)
	}
}
