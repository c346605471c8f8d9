package outbox_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// A person's retry gives a fresh attempt budget, and the history keeps every
// attempt: the ones after the retry are numbered after the earlier ones.
func TestRetryKeepsTheWholeAttemptHistory(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	down := rc.failing(http.StatusInternalServerError)
	ep := f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", map[string]int{"n": 1})[0]
	cfg := fastConfig()
	cfg.MaxAttempts = 2
	f.startRelay(t, cfg, nil)
	within(t, 10*time.Second, func() bool { return f.message(t, id).Status == outbox.StatusFailed }, "the message fails")

	ctx := context.Background()
	eps, err := f.admin.EndpointsHealth(ctx, time.Hour)
	require.NoError(t, err)
	require.Len(t, eps, 1)
	// Two failures of one message are not enough to back off as a whole.
	require.Equal(t, outbox.HealthHealthy, eps[0].State)
	require.EqualValues(t, 1, eps[0].Failed)
	require.Nil(t, eps[0].LastSuccessAt)
	require.Contains(t, eps[0].LastError, "500")

	down.Store(false)
	n, err := f.admin.RetryFailedForEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	within(t, 10*time.Second, func() bool { return f.message(t, id).Status == outbox.StatusDelivered }, "the message is delivered")

	m := f.message(t, id)
	require.Equal(t, 1, m.Attempts, "the budget started again")
	require.Len(t, m.History, 3)
	for i, want := range []string{"retry", "failed", "delivered"} {
		require.Equal(t, i+1, m.History[i].Attempt)
		require.Equal(t, want, m.History[i].Outcome)
	}

	eps, err = f.admin.EndpointsHealth(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthHealthy, eps[0].State)
	require.NotNil(t, eps[0].LastSuccessAt)
	require.Zero(t, eps[0].Failed)

	d, err := f.admin.Dashboard(ctx, time.Now(), 60, time.Hour)
	act := d.Activity
	require.NoError(t, err)
	require.Len(t, act.Minutes, 60)
	var delivered, retried, failed, created int64
	for _, mi := range act.Minutes {
		delivered, retried, failed, created = delivered+mi.Delivered, retried+mi.Retried, failed+mi.Failed, created+mi.Created
	}
	require.EqualValues(t, 1, delivered)
	require.EqualValues(t, 1, retried)
	require.EqualValues(t, 1, failed)
	require.EqualValues(t, 1, created)
	require.EqualValues(t, 1, act.Delivered5m)
	require.EqualValues(t, 1, act.Delivered60m)
	require.Zero(t, act.Minutes[59].Backlog, "nothing waits now")

	// The endpoint's figures, summed as the relay recorded the attempts:
	// three attempts, one delivered, whose request time is the p50 (a
	// bucket holding one request holds its exact time).
	hour, day, err := f.admin.EndpointAttemptStats(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, hour, admin.AttemptStats{Window: time.Hour, Attempts: 3, Delivered: 1, SuccessRate: 1.0 / 3,
		P50MS: hour.P50MS, P95MS: hour.P50MS, P99MS: hour.P50MS,
		Lag: admin.LagStats{Window: time.Hour, Deliveries: 1, P50MS: hour.Lag.P50MS, P95MS: hour.Lag.P50MS, P99MS: hour.Lag.P50MS}})
	require.Greater(t, hour.Lag.P50MS, hour.P50MS, "its lag holds the failure and the retry before its request")
	require.Equal(t, []int64{3, 1}, []int64{day.Attempts, day.Delivered})
	require.Positive(t, m.History[2].DurationMS)
	require.InDelta(t, m.History[2].DurationMS, hour.P50MS, 0.001)

	_, err = f.admin.RetryFailedForEndpoint(ctx, id) // not an endpoint
	require.ErrorIs(t, err, admin.ErrNotFound)
}

// The backlog is reconstructed from the present one, arrivals and settlements.
func TestActivityReconstructsTheBacklog(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	for i := range 5 {
		f.enqueue(t, "order.placed", i)
	}
	ctx := context.Background()
	// Three arrived ten minutes ago, two of them settled five minutes ago.
	_, err := f.pool.Exec(ctx, `UPDATE outbox_messages SET created_at = now() - interval '10 minutes'
		WHERE id IN (SELECT id FROM outbox_messages ORDER BY id LIMIT 3)`)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `
		WITH d AS (UPDATE outbox_messages SET status = 'delivered', attempts = 1, delivered_at = now() - interval '5 minutes'
		           WHERE id IN (SELECT id FROM outbox_messages ORDER BY id LIMIT 2) RETURNING id)
		INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
		SELECT id, 1, 'delivered', now() - interval '5 minutes', now() - interval '5 minutes', 204 FROM d;
		SELECT outbox_attempt_minutes_recount(now() - interval '1 hour')`)
	require.NoError(t, err)

	d, err := f.admin.Dashboard(ctx, time.Now(), 60, time.Hour)
	act := d.Activity
	require.NoError(t, err)
	backlog := func(minutesAgo int) int64 { return act.Minutes[59-minutesAgo].Backlog }
	require.EqualValues(t, 3, backlog(0), "three wait now")
	require.EqualValues(t, 1, backlog(4))
	require.EqualValues(t, 3, backlog(6), "before two were delivered")
	require.EqualValues(t, 3, backlog(9))
	require.EqualValues(t, 0, backlog(11), "before they arrived")
}

// The ops page's panels agree with one another: Dashboard reads them in one
// snapshot from one pass over what waits, its numbers add up across panels,
// and each panel is what its own method reads.
func TestDashboardAgreesWithItsParts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	live := f.endpoint(t, newReceiver(t), "order.placed")
	paused := f.endpoint(t, newReceiver(t), "order.placed")
	_, err := f.admin.SetEndpointEnabled(ctx, paused.ID, false)
	require.NoError(t, err)
	for i := range 6 {
		f.publish(t, outbox.Event{Type: "order.placed", Data: i, OrderingKey: fmt.Sprint("k", i%3)})
	}
	// The live endpoint's six, in commit order (keys k0 k1 k2 k0 k1 k2): the
	// first claimed, the second failed, the third retrying in an hour, the
	// fourth and fifth parked behind them, the sixth due.
	_, err = f.pool.Exec(ctx, `
		WITH m AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox_messages WHERE destination = $1)
		UPDATE outbox_messages o
		SET status = CASE m.n WHEN 1 THEN 'claimed' WHEN 2 THEN 'failed' ELSE 'pending' END,
		    claim_token = CASE m.n WHEN 1 THEN gen_random_uuid() END,
		    claimed_at = CASE m.n WHEN 1 THEN now() END,
		    attempts = CASE m.n WHEN 2 THEN 8 WHEN 3 THEN 1 ELSE 0 END,
		    failed_at = CASE m.n WHEN 2 THEN now() END,
		    next_attempt_at = CASE m.n WHEN 3 THEN now() + interval '1 hour' ELSE o.next_attempt_at END,
		    parked = m.n IN (4, 5)
		FROM m WHERE o.id = m.id`, live.ID)
	require.NoError(t, err)

	d, err := f.admin.Dashboard(ctx, time.Now(), 60, time.Hour)
	require.NoError(t, err)
	o := d.Overview
	require.Equal(t, [4]int64{10, 1, 1, 2}, [4]int64{o.Pending, o.Claimed, o.Failed, o.Parked},
		"pending (parked included), claimed, failed, parked")
	r := d.Relays
	require.Equal(t, [3]int64{1, 1, 6}, [3]int64{r.Due, r.Scheduled, r.Paused}, "due, scheduled, paused")
	require.Equal(t, o.Pending, r.Due+r.Scheduled+r.Paused+o.Parked, "every pending message waits for one reason")
	require.Equal(t, o.Pending+o.Claimed, d.Activity.Minutes[59].Backlog, "the chart ends at what waits now")
	byID := map[uuid.UUID]admin.EndpointHealth{}
	var waiting int64
	for _, e := range d.Endpoints {
		byID[e.ID] = e
		waiting += e.Waiting
	}
	require.Equal(t, o.Pending+o.Claimed, waiting, "the endpoints' waiting messages add up to the overview's")
	l := byID[live.ID]
	require.Equal(t, [4]int64{5, 1, 2, 1}, [4]int64{l.Waiting, l.BackingOff, l.Parked, l.Failed},
		"the live endpoint: waiting, backing off, parked, failed")
	require.NotNil(t, l.NextRetryAt)
	require.Nil(t, byID[paused.ID].NextRetryAt, "nothing of the paused endpoint retries on its own schedule")
	require.EqualValues(t, 6, byID[paused.ID].Waiting)

	// The parts the api also serves on their own read the same.
	rs, err := f.admin.Relays(ctx)
	require.NoError(t, err)
	require.Equal(t, [3]int64{r.Due, r.Scheduled, r.Paused}, [3]int64{rs.Due, rs.Scheduled, rs.Paused})
	eps, err := f.admin.EndpointsHealth(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, d.Endpoints, eps)
}
