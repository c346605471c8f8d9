package outbox_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

// A person's retry gives a fresh attempt budget, and the history keeps every
// attempt: the ones after the retry are numbered after the earlier ones.
func TestRetryKeepsTheWholeAttemptHistory(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	var down atomic.Bool
	down.Store(true)
	rc.respond = func(*http.Request, int) int {
		if down.Load() {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	}
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

	act, err := f.admin.Activity(ctx, time.Now(), 60)
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

	_, err = f.admin.RetryFailedForEndpoint(ctx, id) // not an endpoint
	require.ErrorIs(t, err, outbox.ErrNotFound)
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
		SELECT id, 1, 'delivered', now() - interval '5 minutes', now() - interval '5 minutes', 204 FROM d`)
	require.NoError(t, err)

	act, err := f.admin.Activity(ctx, time.Now(), 60)
	require.NoError(t, err)
	backlog := func(minutesAgo int) int64 { return act.Minutes[59-minutesAgo].Backlog }
	require.EqualValues(t, 3, backlog(0), "three wait now")
	require.EqualValues(t, 1, backlog(4))
	require.EqualValues(t, 3, backlog(6), "before two were delivered")
	require.EqualValues(t, 3, backlog(9))
	require.EqualValues(t, 0, backlog(11), "before they arrived")
}
