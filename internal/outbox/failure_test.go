package outbox_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
)

func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 10*time.Millisecond, msg)
}

func (f fixture) status(t *testing.T, id uuid.UUID) string { return f.message(t, id).Status }

func TestRelayRetriesWithBackoffUntilDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	rc.respond = func(_ *http.Request, n int) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}
	f.endpoint(t, rc, "order.placed")
	ids := f.enqueue(t, "order.placed", 1)
	f.startRelay(t, fastConfig(), nil)

	eventually(t, func() bool { return f.status(t, ids[0]) == outbox.StatusDelivered }, "delivered after two failures")
	m := f.message(t, ids[0])
	require.Equal(t, 3, m.Attempts)
	require.Contains(t, m.LastError, "500 Internal Server Error", "the earlier failure stays on the row")
	require.Equal(t, 1, rc.count(ids[0]))

	// The whole story is kept, attempt by attempt.
	require.Len(t, m.History, 3)
	for i, want := range []struct {
		outcome string
		code    int
	}{{"retry", 500}, {"retry", 500}, {"delivered", 200}} {
		at := m.History[i]
		require.Equal(t, i+1, at.Attempt)
		require.Equal(t, want.outcome, at.Outcome)
		require.Equal(t, want.code, at.StatusCode)
		require.False(t, at.FinishedAt.Before(at.StartedAt))
	}
	require.Contains(t, m.History[0].Error, "500")
	require.Empty(t, m.History[2].Error)
}

func TestRelayPoisonMessageFailsAtCapWhileOthersFlow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	var poison uuid.UUID
	var fixed bool
	rc.respond = func(r *http.Request, _ int) int {
		if r.Header.Get("webhook-id") == poison.String() && !fixed {
			return http.StatusUnprocessableEntity
		}
		return http.StatusNoContent
	}
	f.endpoint(t, rc, "order.placed")
	poison = f.enqueue(t, "order.placed", "poison")[0]
	var healthy []uuid.UUID
	for i := range 20 {
		healthy = append(healthy, f.enqueue(t, "order.placed", i)...)
	}
	cfg := fastConfig()
	cfg.MaxAttempts = 3
	f.startRelay(t, cfg, nil)

	eventually(t, func() bool { return f.status(t, poison) == outbox.StatusFailed }, "poison message fails at the cap")
	for _, id := range healthy {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "healthy messages flow")
	}
	m := f.message(t, poison)
	require.Equal(t, 3, m.Attempts)
	require.Contains(t, m.LastError, "attempt 3 of 3: 422")

	// A person fixes the receiver and requeues.
	rc.mu.Lock()
	fixed = true
	rc.mu.Unlock()
	_, err := f.admin.Retry(context.Background(), healthy[0])
	require.ErrorIs(t, err, outbox.ErrConflict, "only failed messages can be retried")
	_, err = f.admin.Retry(context.Background(), poison)
	require.NoError(t, err)
	eventually(t, func() bool { return f.status(t, poison) == outbox.StatusDelivered }, "requeued message delivered")
	require.Equal(t, 1, rc.count(poison))
}

func TestRelayGoneDisablesEndpoint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	rc.respond = func(*http.Request, int) int { return http.StatusGone }
	ep := f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]
	f.startRelay(t, fastConfig(), nil)

	eventually(t, func() bool { return f.status(t, id) == outbox.StatusFailed }, "410 fails the message")
	require.Equal(t, 1, f.message(t, id).Attempts, "410 is final: no retries")
	got, err := f.admin.Endpoint(context.Background(), ep.ID)
	require.NoError(t, err)
	require.False(t, got.Enabled)
	require.Contains(t, got.DisabledReason, "410")
	require.Empty(t, f.enqueue(t, "order.placed", 2), "a disabled endpoint gets no new messages")
}

func TestRelayHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			rc := newReceiver(t)
			var hits int
			var mu sync.Mutex
			rc.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				hits++
				mu.Unlock()
				w.Header().Set("Retry-After", "120")
				w.WriteHeader(code)
			})
			f.endpoint(t, rc, "order.placed")
			id := f.enqueue(t, "order.placed", 1)[0]
			start := time.Now()
			f.startRelay(t, fastConfig(), nil)

			eventually(t, func() bool { m := f.message(t, id); return m.Status == outbox.StatusPending && m.Attempts == 1 },
				"back to pending after one attempt")
			m := f.message(t, id)
			require.WithinDuration(t, start.Add(120*time.Second), m.NextAttemptAt, 10*time.Second,
				"next attempt follows Retry-After, not the 20ms backoff")
			mu.Lock()
			require.Equal(t, 1, hits)
			mu.Unlock()
		})
	}
}

// A destination that refuses connections or hangs must not delay another
// destination's messages: it backs off on its own.
func TestRelayIsolatesFailingDestinations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	healthy := newReceiver(t)
	f.endpoint(t, healthy, "order.placed")

	// Refusing: a port that was just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refusingURL := "http://" + ln.Addr().String() + "/hook"
	require.NoError(t, ln.Close())
	// Hanging: accepts and never answers.
	hang := make(chan struct{})
	hanging := newReceiver(t)
	hanging.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(hang) })
	ctx := context.Background()
	for _, u := range []string{refusingURL, hanging.srv.URL} {
		_, err := f.admin.CreateEndpoint(ctx, u, []string{"order.placed"})
		require.NoError(t, err)
	}

	var ids []uuid.UUID
	for i := range 100 {
		ids = append(ids, f.enqueue(t, "order.placed", i)...)
	}
	require.Len(t, ids, 300)
	cfg := fastConfig()
	cfg.DeliveryTimeout = time.Second
	cfg.BackoffBase, cfg.BackoffMax = time.Second, 5*time.Second
	start := time.Now()
	f.startRelay(t, cfg, nil)

	eventually(t, func() bool { return healthy.total() == 100 }, "every message for the healthy endpoint delivered")
	elapsed := time.Since(start)
	require.Less(t, elapsed, 5*time.Second, "healthy deliveries did not wait behind the failing destinations")

	// Meanwhile the failing destinations' messages back off with the error
	// recorded, each destination on its own.
	var backingOff int
	eventually(t, func() bool {
		require.NoError(t, f.pool.QueryRow(ctx, `
			SELECT count(DISTINCT destination) FROM outbox_messages
			WHERE status = 'pending' AND attempts >= 1 AND last_error IS NOT NULL
			  AND next_attempt_at > now()`).Scan(&backingOff))
		return backingOff == 2
	}, "both failing destinations back off")
	t.Logf("healthy endpoint drained in %s while two failing destinations backed off", elapsed)
}

// holdingTransport sends for real, then holds the outcome until released:
// the window between send and mark, where a process can die.
type holdingTransport struct {
	outbox.Transport
	sent    chan uuid.UUID
	release chan struct{}
}

func (h *holdingTransport) Deliver(ctx context.Context, d outbox.Delivery) outbox.Result {
	res := h.Transport.Deliver(ctx, d)
	h.sent <- d.MessageID
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return res
}

func crashConfig() outbox.RelayConfig {
	cfg := fastConfig()
	cfg.DeliveryTimeout = 500 * time.Millisecond
	cfg.DeliverBatch, cfg.DeliverConcurrency = 1, 1
	cfg.ClaimTimeout = 3 * time.Second
	return cfg
}

// The relay dies after the webhook went out and before the outcome was
// recorded. Nothing is lost: the claim times out, the message is delivered
// again with the same webhook-id, and the receiver can deduplicate on it.
func TestRelayKilledBetweenSendAndMarkRedelivers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]

	hold := &holdingTransport{
		Transport: &outbox.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 1), release: make(chan struct{}),
	}
	logger := discardLogger()
	relay, err := outbox.NewRelay(f.pool, crashConfig(), hold, logger, nil)
	require.NoError(t, err)
	client, err := relay.NewRiverClient()
	require.NoError(t, err)
	require.NoError(t, client.Start(context.Background()))
	require.Equal(t, id, <-hold.sent)
	require.Equal(t, 1, rc.count(id), "the webhook went out")
	// Kill: cancel the in-flight job; the outcome is never recorded.
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, client.StopAndCancel(stopCtx))
	require.Equal(t, outbox.StatusClaimed, f.status(t, id), "still claimed: the mark never happened")

	// A new relay delivers it again: through River's retry of the cancelled
	// job (its claim token still holds) or, after a hard kill that left no
	// trace in River, through the claim timeout; whichever comes first.
	f.startRelay(t, crashConfig(), nil)
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "redelivered")
	require.Equal(t, 2, rc.count(id), "delivered twice with one webhook-id: at-least-once, counted")
}

// A deliver job that outlives its claim must not record over a newer claim.
func TestStaleDeliverJobCannotOverwriteNewerClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]

	hold := &holdingTransport{
		Transport: &outbox.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 1), release: make(chan struct{}),
	}
	cfg := crashConfig()
	cfg.ClaimTimeout = time.Hour // only the test re-claims
	f.startRelay(t, cfg, hold)
	require.Equal(t, id, <-hold.sent)

	// Meanwhile another relay re-claimed the row (as after a claim timeout).
	newToken := uuid.New()
	_, err := f.pool.Exec(ctx, "UPDATE outbox_messages SET claim_token = $1, claimed_at = now() WHERE id = $2", newToken, id)
	require.NoError(t, err)
	close(hold.release)

	// The stale job finishes (its River job completes) without touching the row.
	eventually(t, func() bool {
		var n int
		_ = f.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver' AND state = 'completed'").Scan(&n)
		return n == 1
	}, "stale job completed")
	var status string
	var token uuid.UUID
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT status, claim_token FROM outbox_messages WHERE id = $1", id).Scan(&status, &token))
	require.Equal(t, outbox.StatusClaimed, status)
	require.Equal(t, newToken, token, "the newer claim is intact")
}

func TestStaleClaimsAreReleasedAndDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]
	// A relay claimed it ten minutes ago and died.
	_, err := f.pool.Exec(ctx, `UPDATE outbox_messages
		SET status = 'claimed', claim_token = gen_random_uuid(), claimed_at = now() - interval '10 minutes', attempts = 1
		WHERE id = $1`, id)
	require.NoError(t, err)

	cfg := fastConfig()
	cfg.ClaimTimeout = time.Minute
	f.startRelay(t, cfg, nil)
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "stuck claim released and delivered")
	m := f.message(t, id)
	require.Equal(t, 2, m.Attempts)
	require.Len(t, m.History, 2)
	require.Equal(t, "timeout", m.History[0].Outcome, "the lost attempt is on record")
	require.Equal(t, "delivered", m.History[1].Outcome)
}

// Two relays at once, no crashes: every message delivered exactly once.
func TestTwoRelaysDeliverEachMessageOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	var mu sync.Mutex
	deliveries := 0
	rc.respond = func(*http.Request, int) int {
		mu.Lock()
		deliveries++
		mu.Unlock()
		return http.StatusNoContent
	}
	f.endpoint(t, rc, "order.placed")
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox_messages (type, destination, payload)
		SELECT 'order.placed', id, to_jsonb(g) FROM webhook_endpoints, generate_series(1, 2000) g`)
	require.NoError(t, err)
	cfg := fastConfig()
	cfg.BatchSize = 100
	f.startRelay(t, cfg, nil)
	f.startRelay(t, cfg, nil)

	eventually(t, func() bool {
		stats, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		return stats.Delivered == 2000
	}, "all delivered and recorded")
	require.Equal(t, 2000, rc.total())
	mu.Lock()
	require.Equal(t, 2000, deliveries, "no message delivered twice")
	mu.Unlock()
}

// A River leader killed without resigning keeps its lease; periodic jobs
// stop until it expires. Claims must not depend on the leader: every worker
// inserts its own claim jobs.
func TestClaimsContinueWhileTheLeaderIsDead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	// A dead process holds the leadership for the next hour.
	_, err := f.pool.Exec(ctx, `INSERT INTO river_leader (elected_at, expires_at, leader_id)
		VALUES (now(), now() + interval '1 hour', 'killed-worker')`)
	require.NoError(t, err)

	f.startRelay(t, fastConfig(), nil)
	id := f.enqueue(t, "order.placed", 1)[0]
	require.Eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered },
		5*time.Second, 10*time.Millisecond, "delivered without a live leader")
	var leader string
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT leader_id FROM river_leader").Scan(&leader))
	require.Equal(t, "killed-worker", leader, "the dead leader still held the lease throughout")
}
