package outbox_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// endpointJSON is what GET /webhook-endpoints/{id} answers, as a client
// reads it: next_attempt_at is always there, null or a time.
type endpointJSON struct {
	ID            uuid.UUID  `json:"id"`
	State         string     `json:"state"`
	DeliveryState string     `json:"delivery_state"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	NextProbeAt   *time.Time `json:"next_probe_at"`
}

// deliveryState reads an endpoint through the admin API, by itself and in
// the list, and requires both to say the same.
func (f fixture) deliveryState(t *testing.T, id uuid.UUID) endpointJSON {
	t.Helper()
	srv := httptest.NewServer(f.admin.Handler())
	defer srv.Close()
	get := func(path string, into any) map[string]any {
		res, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var raw json.RawMessage
		require.NoError(t, json.NewDecoder(res.Body).Decode(&raw))
		require.NoError(t, json.Unmarshal(raw, into))
		var fields map[string]any
		_ = json.Unmarshal(raw, &fields)
		return fields
	}
	var one endpointJSON
	fields := get("/webhook-endpoints/"+id.String(), &one)
	require.Contains(t, fields, "next_attempt_at", "present, null or a time")
	var all []endpointJSON
	get("/webhook-endpoints", &all)
	for _, e := range all {
		if e.ID == id {
			require.Equal(t, one.DeliveryState, e.DeliveryState, "the list says what the endpoint's own answer says")
			require.Equal(t, one.NextAttemptAt == nil, e.NextAttemptAt == nil)
			if one.NextAttemptAt != nil {
				require.True(t, one.NextAttemptAt.Equal(*e.NextAttemptAt))
			}
			return one
		}
	}
	t.Fatalf("endpoint %s is not in the list", id)
	return one
}

// earliestPending is the earliest next attempt of the endpoint's pending,
// not parked messages, and its backoff, as PostgreSQL holds them.
func (f fixture) earliestPending(t *testing.T, id uuid.UUID) (earliest, backoffUntil *time.Time) {
	t.Helper()
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT
		(SELECT min(next_attempt_at) FROM outbox_messages WHERE destination = $1 AND status = 'pending' AND NOT parked),
		(SELECT backoff_until FROM webhook_endpoints WHERE id = $1)`, id).Scan(&earliest, &backoffUntil))
	return earliest, backoffUntil
}

// A healthy endpoint is delivering: with a message due its next attempt is
// that message's time (now or past), and with nothing waiting there is none.
func TestDeliveryStateDelivering(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")

	e := f.deliveryState(t, ep.ID)
	require.Equal(t, admin.DeliveryDelivering, e.DeliveryState)
	require.Nil(t, e.NextAttemptAt, "nothing waits to be tried")

	id := f.enqueue(t, "order.placed", "due")[0]
	e = f.deliveryState(t, ep.ID)
	require.Equal(t, admin.DeliveryDelivering, e.DeliveryState, "a message is due now")
	earliest, _ := f.earliestPending(t, ep.ID)
	require.NotNil(t, e.NextAttemptAt)
	require.True(t, earliest.Equal(*e.NextAttemptAt), "the due message's time: %s, not %s", earliest, e.NextAttemptAt)
	require.False(t, e.NextAttemptAt.After(time.Now()), "due now")

	f.startRelay(t, fastConfig(), nil)
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered")
	e = f.deliveryState(t, ep.ID)
	require.Equal(t, outbox.HealthHealthy, e.State)
	require.Equal(t, admin.DeliveryDelivering, e.DeliveryState)
	require.Nil(t, e.NextAttemptAt, "nothing waits once it is delivered")
}

// A receiver that answers 422 to everything never opens the circuit (a 422
// is about the message), so the endpoint stays healthy; but every message
// it has waits out its own retry, and it is retrying until the earliest of
// them, not delivering.
func TestDeliveryStateRetryingOnA422(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	rc.failing(http.StatusUnprocessableEntity)
	ep := f.endpoint(t, rc, "order.placed")
	ids := append(f.enqueue(t, "order.placed", 1), f.enqueue(t, "order.placed", 2)...)

	cfg := fastConfig()
	cfg.RetrySchedule, cfg.BackoffBase, cfg.BackoffMax = []time.Duration{time.Hour}, 0, 0
	f.startRelay(t, cfg, nil)
	eventually(t, func() bool {
		for _, id := range ids {
			if m := f.message(t, id); m.Status != outbox.StatusPending || m.Attempts != 1 {
				return false
			}
		}
		return true
	}, "each message was refused once and waits for its retry")

	e := f.deliveryState(t, ep.ID)
	require.Equal(t, outbox.HealthHealthy, e.State, "state keeps its meaning: the circuit is closed")
	require.Equal(t, admin.DeliveryRetrying, e.DeliveryState)
	earliest, backoffUntil := f.earliestPending(t, ep.ID)
	require.Nil(t, backoffUntil, "a 422 holds back no destination")
	require.NotNil(t, e.NextAttemptAt)
	require.True(t, earliest.Equal(*e.NextAttemptAt), "the earliest retry, %s; got %s", earliest, e.NextAttemptAt)
	require.WithinDuration(t, time.Now().Add(time.Hour), *e.NextAttemptAt, 10*time.Minute, "the one-hour retry (±10%)")
}

// An endpoint failing as a whole has its circuit open: its next attempt is
// its probe, the later of the backoff and its earliest message.
func TestDeliveryStateCircuitOpen(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	rc.failing(http.StatusServiceUnavailable)
	ep := f.endpoint(t, rc, "order.placed")
	for i := range 10 {
		f.enqueue(t, "order.placed", i)
	}
	cfg := relay.Config{RetrySchedule: []time.Duration{time.Hour}}
	rl := f.startRelay(t, cfg, nil)
	eventually(t, func() bool {
		got, err := f.admin.Endpoint(ctx, ep.ID)
		require.NoError(t, err)
		return got.State == outbox.HealthBackingOff
	}, "the circuit opens")
	// Stopped, so no probe moves what the answer is compared with.
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, rl.Stop(stopCtx))

	e := f.deliveryState(t, ep.ID)
	require.Equal(t, outbox.HealthBackingOff, e.State)
	require.Equal(t, admin.DeliveryCircuitOpen, e.DeliveryState)
	earliest, backoffUntil := f.earliestPending(t, ep.ID)
	require.NotNil(t, earliest, "messages wait behind the open circuit")
	require.NotNil(t, backoffUntil)
	want := *earliest
	if backoffUntil.After(want) {
		want = *backoffUntil
	}
	require.NotNil(t, e.NextAttemptAt)
	require.True(t, want.Equal(*e.NextAttemptAt), "the later of the backoff (%s) and the earliest message (%s); got %s",
		backoffUntil, earliest, e.NextAttemptAt)
	require.True(t, e.NextProbeAt.Equal(*backoffUntil), "next_probe_at keeps its meaning")
}

// A paused endpoint tries nothing: no next attempt, whatever waits.
func TestDeliveryStatePaused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	_, err := f.admin.SetEndpointEnabled(ctx, ep.ID, false)
	require.NoError(t, err)
	f.enqueue(t, "order.placed", "waits")

	e := f.deliveryState(t, ep.ID)
	require.Equal(t, outbox.HealthPaused, e.State)
	require.Equal(t, admin.DeliveryPaused, e.DeliveryState)
	require.Nil(t, e.NextAttemptAt, "a paused endpoint is not tried")
	earliest, _ := f.earliestPending(t, ep.ID)
	require.NotNil(t, earliest, "its message waits")
}

// A receiver's Retry-After holds the whole endpoint back with its circuit
// closed: what is due waits for the end of the wait, so the endpoint is
// retrying until then, and its next attempt is that end, not the earlier
// time its message became due.
func TestDeliveryStateRetryingOnRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")
	f.enqueue(t, "order.placed", "due, held back")
	_, err := f.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET backoff_until = now() + interval '2 minutes' WHERE id = $1`, ep.ID)
	require.NoError(t, err)

	e := f.deliveryState(t, ep.ID)
	require.Equal(t, outbox.HealthHealthy, e.State)
	require.Equal(t, admin.DeliveryRetrying, e.DeliveryState)
	earliest, backoffUntil := f.earliestPending(t, ep.ID)
	require.True(t, earliest.Before(*backoffUntil))
	require.NotNil(t, e.NextAttemptAt)
	require.True(t, backoffUntil.Equal(*e.NextAttemptAt), "the end of the Retry-After, %s; got %s", backoffUntil, e.NextAttemptAt)
}
