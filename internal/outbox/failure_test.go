package outbox_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// eventually fails the test unless cond holds within 20 s. It checks in the
// test's own goroutine (unlike require.Eventually), so a condition that
// queries the database never runs after the test has closed its pool.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	within(t, 20*time.Second, cond, msg)
}

// within fails the test unless cond holds within d.
func within(t *testing.T, d time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition never satisfied within %s: "+msg, append([]any{d}, args...)...)
		}
	}
}

// never fails the test if cond holds at any check during d.
func never(t *testing.T, d time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			t.Fatalf("condition satisfied, but must not be: "+msg, args...)
		}
	}
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
	require.Equal(t, 1, rc.count(f.event(t, ids[0])))

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
	var poisonEvent uuid.UUID
	var fixed bool
	rc.respond = func(r *http.Request, _ int) int {
		if r.Header.Get("webhook-id") == poisonEvent.String() && !fixed {
			return http.StatusUnprocessableEntity
		}
		return http.StatusNoContent
	}
	f.endpoint(t, rc, "order.placed")
	poisonEvent = f.publish(t, outbox.Event{Type: "order.placed", Data: "poison"})
	poison := f.deliveries(t, poisonEvent)[0]
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
	require.ErrorIs(t, err, admin.ErrConflict, "only failed messages can be retried")
	_, err = f.admin.Retry(context.Background(), poison)
	require.NoError(t, err)
	eventually(t, func() bool { return f.status(t, poison) == outbox.StatusDelivered }, "requeued message delivered")
	require.Equal(t, 1, rc.count(poisonEvent))
}

// A 410 Gone pauses the endpoint: the message that met it, and every one
// committed while it is paused, waits without spending attempts, and all of
// them are delivered once a person enables it again.
func TestRelayGonePausesTheEndpointAndNothingIsDropped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	gone := rc.failing(http.StatusGone)
	ep := f.endpoint(t, rc, "order.placed")
	first := f.enqueue(t, "order.placed", 1)[0]
	f.startRelay(t, fastConfig(), nil)

	eventually(t, func() bool {
		got, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return !got.Enabled
	}, "410 pauses the endpoint")
	got, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthPaused, got.State)
	require.Contains(t, got.DisabledReason, "410")
	m := f.message(t, first)
	require.Equal(t, outbox.StatusPending, m.Status, "the message waits, it is not failed")
	require.Equal(t, 1, m.Attempts)
	require.Equal(t, "gone", m.History[0].Outcome)

	// Events committed while paused are written and wait.
	var later []uuid.UUID
	for i := range 3 {
		ids := f.enqueue(t, "order.placed", 10+i)
		require.Len(t, ids, 1, "a paused endpoint still gets its messages")
		later = append(later, ids...)
	}
	// Waiting is not an attempt: nothing is sent to a paused endpoint.
	never(t, 500*time.Millisecond, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return len(rc.attempts) > 1
	}, "nothing is sent while paused")
	for _, id := range later {
		require.Equal(t, 0, f.message(t, id).Attempts)
	}

	gone.Store(false)
	_, err = f.admin.SetEndpointEnabled(ctx, ep.ID, true)
	require.NoError(t, err)
	for _, id := range append(later, first) {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered after enabling")
		require.Equal(t, 1, rc.count(f.event(t, id)))
	}
	require.Equal(t, 1, f.message(t, later[0]).Attempts, "the wait cost no attempt")
}

// Deleting an endpoint stops its deliveries for good, at once and visibly:
// its waiting messages are discarded with the reason, and cannot be retried.
func TestDeletingAnEndpointDiscardsItsUndeliveredMessages(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	_, err := f.admin.SetEndpointEnabled(ctx, ep.ID, false)
	require.NoError(t, err)
	waiting := f.enqueue(t, "order.placed", 1)[0]
	failed := f.enqueue(t, "order.placed", 2)[0]
	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', failed_at = now(), attempts = 8, last_error = '500' WHERE id = $1`, failed)
	require.NoError(t, err)

	n, err := f.admin.DeleteEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	for _, id := range []uuid.UUID{waiting, failed} {
		m := f.message(t, id)
		require.Equal(t, outbox.StatusDiscarded, m.Status)
		require.Equal(t, "endpoint deleted", m.LastError)
		_, err := f.admin.Retry(ctx, id)
		require.ErrorIs(t, err, admin.ErrConflict, "a discarded message cannot be retried")
	}
	stats, err := f.admin.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, stats.Discarded)
	require.Zero(t, stats.Pending+stats.Failed, "nothing waits, nothing raises a failed alert")

	// A relay finds nothing to do for it.
	f.startRelay(t, fastConfig(), nil)
	never(t, 300*time.Millisecond, func() bool { return rc.total() > 0 }, "nothing is sent to the deleted endpoint")
	_, err = f.admin.DeleteEndpoint(ctx, ep.ID)
	require.ErrorIs(t, err, admin.ErrNotFound)
}

// A deletion settles a backlog larger than one batch: every batch is
// discarded, the failed ones among the first, and the count says so.
func TestDeletingAnEndpointDiscardsABacklogInBatches(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	const waiting = 25_000 // two and a half batches
	ids := outboxtest.Seed(t, f.pool, ep.ID, waiting, "")
	_, err := f.pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', failed_at = now(), attempts = 8, last_error = '500'
		WHERE id = $1`, ids[len(ids)-1])
	require.NoError(t, err)

	n, err := f.admin.DeleteEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.EqualValues(t, waiting, n, "every message discarded, in batches")
	var left int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status <> 'discarded'`,
		ep.ID).Scan(&left))
	require.Zero(t, left)
}

// Pending messages of a deleted endpoint (a backlog its deletion left to
// the relay, or rows an order transaction wrote while the deletion ran) are
// discarded by the relay's orphan job, in batches.
func TestRelayDiscardsMessagesOfDeletedEndpoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	_, err := f.admin.DeleteEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	const orphans = 12_000 // more than one batch
	outboxtest.Seed(t, f.pool, ep.ID, orphans, "")
	f.startRelay(t, fastConfig(), nil) // the orphan job runs at start
	eventually(t, func() bool {
		var discarded int
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'discarded'`,
			ep.ID).Scan(&discarded))
		return discarded == orphans
	}, "every orphan is discarded")
	require.Zero(t, rc.total(), "none was sent")
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
			require.WithinDuration(t, start.Add(120*time.Second), *m.NextAttemptAt, 10*time.Second,
				"next attempt follows Retry-After, not the 20ms backoff")
			// The whole destination waits, not only this message.
			ep, err := f.admin.Endpoint(context.Background(), m.Destination)
			require.NoError(t, err)
			require.NotNil(t, ep.ThrottledUntil)
			require.WithinDuration(t, start.Add(120*time.Second), *ep.ThrottledUntil, 10*time.Second)
			second := f.enqueue(t, "order.placed", 2)[0]
			never(t, 300*time.Millisecond, func() bool { return f.message(t, second).Attempts > 0 },
				"a new message waits for the Retry-After too")
			mu.Lock()
			require.Equal(t, 1, hits)
			mu.Unlock()
		})
	}
}

// A destination that refuses connections or hangs must not delay another
// destination's messages, at the default settings: it backs off as a whole
// after a few failures instead of every message discovering it separately,
// and its waiting messages spend no attempts.
func TestRelayIsolatesFailingDestinations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
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
	var failing []uuid.UUID
	for _, u := range []string{refusingURL, hanging.srv.URL} {
		ep, err := f.admin.CreateEndpoint(ctx, u, []string{"order.placed"})
		require.NoError(t, err)
		failing = append(failing, ep.ID)
	}

	var ids []uuid.UUID
	for i := range 100 {
		ids = append(ids, f.enqueue(t, "order.placed", i)...)
	}
	require.Len(t, ids, 300)
	start := time.Now()
	f.startRelay(t, relay.Config{}, nil) // the defaults

	eventually(t, func() bool { return healthy.total() == 100 }, "every message for the healthy endpoint delivered")
	elapsed := time.Since(start)
	require.Less(t, elapsed, 5*time.Second, "healthy deliveries did not wait behind the failing destinations")

	// Each failing destination backs off as a whole: after the refusals
	// (at once) and the timeouts, nothing more is sent until its probe. A
	// new destination's pace starts at two requests and each timeout halves
	// it, so a hanging one is learned at the pace of its timeouts: two at
	// the first delivery timeout (10 s), then one per timeout, five in a
	// row after about four timeouts.
	cfg := relay.DefaultConfig()
	for _, id := range failing {
		within(t, 4*cfg.DeliveryTimeout+15*time.Second, func() bool {
			ep, err := f.admin.Endpoint(ctx, id)
			require.NoError(t, err)
			return ep.State == outbox.HealthBackingOff && ep.NextProbeAt != nil
		}, "the failing destination backs off as a whole")
		ep, err := f.admin.Endpoint(ctx, id)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ep.ConsecutiveFailures, cfg.CircuitThreshold)
		require.NotEmpty(t, ep.StateReason)
		var attempted, attempts int
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempts > 0), coalesce(sum(attempts), 0)
			FROM outbox_messages WHERE destination = $1`, id).Scan(&attempted, &attempts))
		// The failures that opened the circuit, one attempt each: the
		// pace never let more out at once.
		require.LessOrEqual(t, attempted, cfg.CircuitThreshold+1,
			"the other messages waited behind the open circuit without spending attempts")
		require.Equal(t, attempted, attempts, "no message was tried twice")
		t.Logf("%s: backing off after %d failures; %d of 100 messages tried once, next probe in %s (%s)",
			ep.URL, ep.ConsecutiveFailures, attempted, time.Until(*ep.NextProbeAt).Round(time.Second), ep.StateReason)
	}
	t.Logf("healthy endpoint drained in %s while two failing destinations backed off", elapsed)
}

// A destination backing off is probed with one message; when the probe gets
// an answer it is healthy again and its waiting messages flow, each having
// spent no attempt while it waited.
func TestBackingOffDestinationRecoversAfterAProbe(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	down := rc.failing(http.StatusServiceUnavailable)
	ep := f.endpoint(t, rc, "order.placed")
	var ids []uuid.UUID
	for i := range 100 {
		ids = append(ids, f.enqueue(t, "order.placed", i)...)
	}
	f.startRelay(t, relay.Config{}, nil) // the defaults
	eventually(t, func() bool {
		got, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return got.State == outbox.HealthBackingOff
	}, "backing off after repeated 503s")
	down.Store(false)

	// The first probe comes 5 s (±10%) after it started backing off.
	for _, id := range ids {
		within(t, 20*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered after the probe")
	}
	got, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthHealthy, got.State)
	require.Zero(t, got.ConsecutiveFailures)
	require.Nil(t, got.NextProbeAt)
	var tried int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND attempts > 1`,
		ep.ID).Scan(&tried))
	cfg := relay.DefaultConfig()
	require.LessOrEqual(t, tried, cfg.DestinationConcurrency+cfg.CircuitThreshold-1,
		"only the messages sent before the circuit opened were tried twice")
}

// A receiver that does not verify our signature (a stale secret after a
// rotation gone wrong) answers 401 to every message: the endpoint's trouble,
// not each message's. At the defaults it backs off as a whole, the messages
// behind the ones that found out wait without spending attempts, and once
// its secret is fixed everything flows after a probe, none left on a retry
// minutes or hours away.
func TestAReceiverRejectingOurSignatureBacksOffAsAWhole(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	stale, err := webhook.NewSecret()
	require.NoError(t, err)
	rc.setSecret(stale) // every delivery: 401
	var ids []uuid.UUID
	for i := range 100 {
		ids = append(ids, f.enqueue(t, "order.placed", i)...)
	}
	f.startRelay(t, relay.Config{}, nil) // the defaults
	eventually(t, func() bool {
		got, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return got.State == outbox.HealthBackingOff
	}, "backing off as a whole after 401s")
	rc.mu.Lock()
	rejected := rc.badSigned
	rc.mu.Unlock()
	// The first claim fills every slot; until the circuit opens, at its
	// threshold, a slow machine may refill the slots of the failures
	// handled so far (the job claims freed slots each poll interval); then
	// perhaps a probe. Never the rest of the backlog.
	cfg := relay.DefaultConfig()
	require.LessOrEqual(t, rejected, cfg.DestinationConcurrency+cfg.CircuitThreshold,
		"what was in flight, the refills before the circuit opened, perhaps a probe: not every message")

	rc.setSecret(ep.Secret) // fixed
	for _, id := range ids {
		within(t, 20*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered after the probe")
	}
	var most int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT max(attempts) FROM outbox_messages WHERE destination = $1`, ep.ID).Scan(&most))
	require.LessOrEqual(t, most, 3, "no message spent more than a rejection, a probe and its delivery")
}

// An outage pushes back the retries of the messages that probed it (5 s,
// then 5 min, 30 min, up to 10 h: a day-long outage leaves some due hours
// after the receiver is back, each holding its ordering key). When a probe
// gets an answer they are due at once, and the outage ends for every
// message, in key order. At the defaults: keyed events, their heads fail
// with 503s until the circuit opens, probes push one head to its 5-minute
// retry, then the receiver comes back.
func TestRecoveryBringsForwardTheRetriesTheOutagePushedBack(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	down := rc.failing(http.StatusServiceUnavailable)
	ep := f.endpoint(t, rc, "order.placed")
	cfg := relay.DefaultConfig()
	// One more key than it takes to open the circuit, two events each.
	var heads, followers []uuid.UUID
	for _, list := range []*[]uuid.UUID{&heads, &followers} {
		for i := range cfg.CircuitThreshold + 1 {
			*list = append(*list, f.deliveries(t, f.publish(t, outbox.Event{Type: "order.placed", Data: i,
				OrderingKey: fmt.Sprintf("order-%d", i)}))...)
		}
	}
	f.startRelay(t, relay.Config{}, nil) // the defaults

	// A probe takes a head to its second failure: its next try is 5 min
	// (±10 %) away.
	var pushed uuid.UUID
	within(t, 30*time.Second, func() bool {
		return f.pool.QueryRow(ctx, `SELECT id FROM outbox_messages
			WHERE destination = $1 AND status = 'pending' AND attempts >= 2 AND next_attempt_at > now() + interval '4 minutes'`,
			ep.ID).Scan(&pushed) == nil
	}, "a probe pushes a message to its 5-minute retry")
	got, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthBackingOff, got.State)
	require.NotNil(t, got.NextProbeAt)
	down.Store(false)

	// The next probe, at the end of the backoff (doubled with each failed
	// probe), gets an answer: everything is delivered soon after.
	recoveredBy := got.NextProbeAt.Add(10 * time.Second)
	for _, id := range append(heads, followers...) {
		within(t, time.Until(recoveredBy), func() bool { return f.status(t, id) == outbox.StatusDelivered },
			"delivered once the receiver answers, not 5 min later")
	}
	pushedMsg := f.message(t, pushed)
	require.GreaterOrEqual(t, pushedMsg.Attempts, 3, "two failures, then the delivery")
	for i := range heads {
		var inOrder bool
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT h.delivered_at < f.delivered_at
			FROM outbox_messages h, outbox_messages f WHERE h.id = $1 AND f.id = $2`, heads[i], followers[i]).Scan(&inOrder))
		require.True(t, inOrder, "key %d: its second event after its first", i)
	}
}

// holdingTransport sends for real, then holds the outcome until released:
// the window between send and mark, where a process can die.
type holdingTransport struct {
	relay.Transport
	sent    chan uuid.UUID
	release chan struct{}
}

func (h *holdingTransport) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	res := h.Transport.Deliver(ctx, d)
	h.sent <- d.MessageID
	select {
	case <-h.release:
		return res
	case <-ctx.Done():
		// Cut off: the receiver's answer never reached the relay.
		return relay.Result{Err: ctx.Err()}
	}
}

// The relay is stopped after the webhook went out and before the outcome
// came back, past its grace period. Nothing is lost and nothing is left
// claimed: the cut-off request counts as an attempt ("interrupted"), the
// message is due again at once, and the next relay delivers it again with
// the same webhook-id, which the receiver deduplicates on.
func TestRelayStoppedBetweenSendAndMarkRedelivers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]

	hold := &holdingTransport{
		Transport: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 1), release: make(chan struct{}),
	}
	rl, err := relay.New(f.pool, fastConfig(), hold, discardLogger(), nil)
	require.NoError(t, err)
	require.NoError(t, rl.Start(context.Background()))
	require.Equal(t, id, <-hold.sent)
	require.Equal(t, 1, rc.count(f.event(t, id)), "the webhook went out")
	require.Equal(t, outbox.StatusClaimed, f.status(t, id))

	// Stop with no grace left: the request in flight is cut off.
	expired, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-expired.Done()
	require.NoError(t, rl.Stop(expired))
	m := f.message(t, id)
	require.Equal(t, outbox.StatusPending, m.Status, "released at once, not left to a timeout")
	require.Equal(t, 1, m.Attempts)
	require.Equal(t, "interrupted", m.History[0].Outcome)
	require.False(t, m.NextAttemptAt.After(time.Now()), "due again at once")
	var relays int
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_relays").Scan(&relays))
	require.Zero(t, relays, "the stopped relay left outbox_relays")

	f.startRelay(t, fastConfig(), nil)
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "redelivered")
	require.Equal(t, 2, rc.count(f.event(t, id)), "delivered twice with one webhook-id: at-least-once, counted")
}

// A relay stopped past its grace period with a full batch of requests in
// flight (here 64, one flush's worth) records them all as interrupted and
// stops. Its cancelled job used to flush them again and again on its
// cancelled context, every flush failing at once, and never reached its
// settle: Stop timed out and the destination stayed leased to a live
// relay. At the defaults it takes a busy destination and a database
// outage longer than a job's timeout.
func TestRelayStoppedWithAFullBatchInFlightSettlesIt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	const n = 64
	var ids []uuid.UUID
	for i := range n {
		ids = append(ids, f.enqueue(t, "order.placed", i)[0])
	}
	hold := &holdingTransport{
		Transport: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, n), release: make(chan struct{}),
	}
	cfg := fastConfig()
	cfg.DestinationConcurrency = n
	// A destination the relay was sending to at full pace.
	_, err := f.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET pace = $1`, n)
	require.NoError(t, err)
	rl, err := relay.New(f.pool, cfg, hold, discardLogger(), nil)
	require.NoError(t, err)
	require.NoError(t, rl.Start(context.Background()))
	for range n {
		<-hold.sent
	}

	expired, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-expired.Done()
	require.NoError(t, rl.Stop(expired), "the job settles its batch and ends")
	for _, id := range ids {
		m := f.message(t, id)
		require.Equal(t, outbox.StatusPending, m.Status, "released at once, not left claimed")
		require.Equal(t, "interrupted", m.History[0].Outcome, "recorded as what happened to it")
	}
}

// A graceful stop within its grace period lets the request in flight finish
// and records it: nothing is sent twice.
func TestRelayStopLetsRequestsInFlightFinish(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]
	hold := &holdingTransport{
		Transport: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 1), release: make(chan struct{}),
	}
	rl, err := relay.New(f.pool, fastConfig(), hold, discardLogger(), nil)
	require.NoError(t, err)
	require.NoError(t, rl.Start(context.Background()))
	require.Equal(t, id, <-hold.sent)

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- rl.Stop(ctx)
	}()
	// Stop waits for the request, which ends when the receiver answers.
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned before the request in flight ended: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(hold.release)
	require.NoError(t, <-stopped)
	m := f.message(t, id)
	require.Equal(t, outbox.StatusDelivered, m.Status)
	require.Equal(t, 1, rc.count(f.event(t, id)))
}

// A relay that dies holding claims (SIGKILL: no Stop, no heartbeat) is
// declared dead by the others within the relay timeout, and its messages
// are delivered at once, each attempt cut off by the death recorded as
// interrupted. At the default settings.
func TestDeadRelaysClaimsAreDeliveredWithinSeconds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	ids := []uuid.UUID{f.enqueue(t, "order.placed", 1)[0], f.enqueue(t, "order.placed", 2)[0]}
	// A relay claimed both and served the endpoint; its last heartbeat was
	// just now, and then it died.
	dead := uuid.New()
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid) VALUES ($1, 'gone', 1)`, dead)
	require.NoError(t, err)
	token := uuid.New()
	_, err = f.pool.Exec(ctx, `UPDATE webhook_endpoints SET lease_token = $1, lease_relay = $2 WHERE id = $3`, token, dead, ep.ID)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = $1, claimed_by = $2, claimed_at = now()
		WHERE id = ANY ($3)`, token, dead, ids)
	require.NoError(t, err)

	start := time.Now()
	f.startRelay(t, relay.Config{}, nil) // the defaults
	for _, id := range ids {
		within(t, 15*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "the dead relay's claim is delivered")
	}
	took := time.Since(start)
	relayTimeout := relay.DefaultConfig().RelayTimeout
	require.Less(t, took, relayTimeout+3*time.Second, "within the relay timeout and a heartbeat or two")
	require.Greater(t, took, relayTimeout/2, "not before the dead relay's heartbeat was old enough")
	m := f.message(t, ids[0])
	require.Equal(t, 2, m.Attempts)
	require.Equal(t, []string{"interrupted", "delivered"}, []string{m.History[0].Outcome, m.History[1].Outcome})
	requireLatest(t, f, ep.ID, m.History[0].Error)
	var left int
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM outbox_relays WHERE id = $1", dead).Scan(&left))
	require.Zero(t, left, "the dead relay was removed")
	t.Logf("delivered %s after the relay's last heartbeat (relay timeout %s)", took.Round(time.Millisecond), relayTimeout)
}

// A deliver job whose claim was taken over (its relay was declared dead
// and another claimed the row) must not record over the newer claim.
func TestStaleDeliverJobCannotOverwriteNewerClaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	id := f.enqueue(t, "order.placed", 1)[0]

	hold := &holdingTransport{
		Transport: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		sent:      make(chan uuid.UUID, 1), release: make(chan struct{}),
	}
	f.startRelay(t, fastConfig(), hold)
	require.Equal(t, id, <-hold.sent)

	// Meanwhile another relay re-claimed the row.
	newToken := uuid.New()
	_, err := f.pool.Exec(ctx, "UPDATE outbox_messages SET claim_token = $1, claimed_at = now() WHERE id = $2", newToken, id)
	require.NoError(t, err)
	close(hold.release)

	// The stale job ends (its River job completes) without touching the row.
	eventually(t, func() bool {
		var n int
		_ = f.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind = 'outbox_deliver' AND state = 'completed'").Scan(&n)
		return n >= 1
	}, "stale job completed")
	var status string
	var token uuid.UUID
	var attempts int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT status, claim_token, (SELECT count(*) FROM outbox_attempts WHERE message_id = m.id)
		FROM outbox_messages m WHERE id = $1`, id).Scan(&status, &token, &attempts))
	require.Equal(t, outbox.StatusClaimed, status)
	require.Equal(t, newToken, token, "the newer claim is intact")
	require.Zero(t, attempts, "the stale job recorded nothing")
}

// The last resort: a claim held by a relay that is alive but never records
// an outcome is released after the claim timeout.
func TestStaleClaimsAreReleasedAndDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	cfg := fastConfig()
	cfg.ClaimTimeout = time.Minute
	f.startRelay(t, cfg, nil)
	// A claim in the live relay's name, ten minutes old, that no job holds
	// (written claimed, so no job ever sees it pending): only the claim
	// timeout can release it.
	var id uuid.UUID
	require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		id = outboxtest.Seed(t, tx, ep.ID, 1, "")[0]
		_, err := tx.Exec(ctx, `UPDATE outbox_messages
			SET status = 'claimed', claim_token = gen_random_uuid(), claimed_by = (SELECT id FROM outbox_relays), claimed_at = now() - interval '10 minutes'
			WHERE id = $1`, id)
		return err
	}))
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "stuck claim released and delivered")
	m := f.message(t, id)
	require.Equal(t, 2, m.Attempts)
	require.Len(t, m.History, 2)
	require.Equal(t, "timeout", m.History[0].Outcome, "the lost attempt is on record")
	require.Equal(t, "delivered", m.History[1].Outcome)
	requireLatest(t, f, ep.ID, "claim timed out: the relay did not record an outcome")
}

// requireLatest checks what the endpoint says of its latest attempts after
// a released claim was delivered: the release is its latest error, the
// delivery its latest success and latest attempt.
func requireLatest(t *testing.T, f fixture, endpoint uuid.UUID, releaseError string) {
	t.Helper()
	h, err := f.admin.EndpointHealth(context.Background(), endpoint, time.Hour)
	require.NoError(t, err)
	require.NotEmpty(t, releaseError)
	require.Equal(t, releaseError, h.LastError, "the release is the endpoint's latest error")
	require.NotNil(t, h.LastErrorAt)
	require.NotNil(t, h.LastSuccessAt)
	require.False(t, h.LastSuccessAt.Before(*h.LastErrorAt), "the delivery came after the release")
	require.Equal(t, "delivered", h.LastAttemptOutcome)
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
	ep := f.endpoint(t, rc, "order.placed")
	outboxtest.Seed(t, f.pool, ep.ID, 2000, "")
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
// stop until it expires. Deliveries must not depend on the leader: every
// relay dispatches due destinations itself.
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
	within(t, 5*time.Second, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered without a live leader")
	var leader string
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT leader_id FROM river_leader").Scan(&leader))
	require.Equal(t, "killed-worker", leader, "the dead leader still held the lease throughout")
}

// A receiver's error answer is recorded whatever its bytes: a body cut
// inside a character, or holding NUL bytes, used to make PostgreSQL refuse
// the outcome statement, so the attempt was never recorded, the job never
// settled, and the destination stayed leased (and silent) until the
// process restarted.
func TestRelayRecordsAnErrorBodyOfAnyBytes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var calls sync.Map // webhook-id → requests
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := calls.LoadOrStore(r.Header.Get("webhook-id"), new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			// 199 bytes, then a two-byte character the 200-byte excerpt cuts
			// in half, then binary.
			_, _ = w.Write([]byte(strings.Repeat("x", 199) + "é\x00\xff\xfe"))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	_, err := f.admin.CreateEndpoint(context.Background(), srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)
	first := f.enqueue(t, "order.placed", 1)[0]
	f.startRelay(t, fastConfig(), nil)

	eventually(t, func() bool { return f.status(t, first) == outbox.StatusDelivered }, "delivered at the second attempt")
	m := f.message(t, first)
	require.Equal(t, 2, m.Attempts)
	require.Len(t, m.History, 2)
	e := m.History[0].Error
	require.True(t, strings.HasPrefix(e, "500 Internal Server Error: "+strings.Repeat("x", 199)), e)
	require.True(t, utf8.ValidString(e), "the recorded error is text: %q", e)
	require.NotContains(t, e, "\x00")

	// The destination is not held: what comes next is delivered too.
	next := f.enqueue(t, "order.placed", 2)[0]
	eventually(t, func() bool { return f.status(t, next) == outbox.StatusDelivered }, "the next message is delivered")
}

// A lock held on one endpoint's row (an operator's open transaction, a
// worker frozen mid-statement) holds up the recovery of that destination's
// lost claims alone: another destination's, lost with the same dead relay,
// is released and delivered at once, and the held one's once the lock is
// let go. Before, the release of a dead relay's claims was one
// transaction over all its destinations, which waited for the lock.
func TestALockOnOneEndpointHoldsUpNoOtherDestinationsRecovery(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a, b := newReceiver(t), newReceiver(t)
	epA := f.endpoint(t, a, "order.placed")
	f.endpoint(t, b, "order.placed")
	ids := f.enqueue(t, "order.placed", 1)
	require.Len(t, ids, 2)
	dead := uuid.New()
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox_relays (id, hostname, pid, heartbeat_at, timeout_seconds, claim_timeout_seconds)
		VALUES ($1, 'gone', 1, now() - interval '1 hour', 5, 300)`, dead)
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE outbox_messages SET status = 'claimed', claim_token = gen_random_uuid(),
		claimed_at = now() - interval '10 seconds', claimed_by = $1 WHERE id = ANY ($2)`, dead, ids)
	require.NoError(t, err)
	op, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer op.Rollback(ctx) //nolint:errcheck
	_, err = op.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE`, epA.ID)
	require.NoError(t, err)

	f.startRelay(t, relay.Config{}, nil) // the defaults
	within(t, 10*time.Second, func() bool { return b.total() == 1 }, "the other destination's lost claim is delivered beside the lock")
	require.Zero(t, a.total())
	var status string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT status FROM outbox_messages WHERE destination = $1`, epA.ID).Scan(&status))
	require.Equal(t, outbox.StatusClaimed, status, "the locked destination's waits")
	require.NoError(t, op.Rollback(ctx))
	within(t, 10*time.Second, func() bool { return a.total() == 1 }, "and goes once the lock is let go")
}
