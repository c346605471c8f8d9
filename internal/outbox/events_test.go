package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// One event sent to two endpoints reaches both under one webhook-id, the
// event's: a receiver listening on both (or moving from one URL to the
// other) applies it once.
func TestOneEventOneIDForEveryEndpoint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, b := newReceiver(t), newReceiver(t)
	f.endpoint(t, a, "order.placed")
	f.endpoint(t, b, "order.placed")
	event := f.publish(t, outbox.Event{Type: "order.placed", Data: map[string]int{"n": 1}})
	deliveries := f.deliveries(t, event)
	require.Len(t, deliveries, 2)
	require.NotEqual(t, deliveries[0], deliveries[1], "each delivery is its own row")

	f.startRelay(t, relay.Config{}, nil)
	eventually(t, func() bool { return a.count(event) == 1 && b.count(event) == 1 }, "both endpoints got the event")
	for _, rc := range []*receiver{a, b} {
		rc.mu.Lock()
		env := rc.bodies[event.String()]
		rc.mu.Unlock()
		require.Equal(t, event.String(), env.ID, "webhook-id and body id are the event id at every endpoint")
	}
	for _, id := range deliveries {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "recorded")
		require.Equal(t, event, f.message(t, id).EventID)
	}
	list, _, err := f.admin.Messages(context.Background(), admin.MessageFilter{Event: &event})
	require.NoError(t, err)
	require.Len(t, list, 2, "the admin finds an event's deliveries by its id")
}

// arrival is one request an ordering receiver saw.
type arrival struct {
	key     string
	seq     int
	event   string
	at      time.Time
	status  int
	attempt int
}

// orderingReceiver records every request with its event's key and
// sequence number, and answers 422 to the first attempt of each key's
// first event: a message-level refusal, retried on the default schedule.
type orderingReceiver struct {
	mu       sync.Mutex
	arrivals []arrival
	attempts map[string]int
	inFlight map[string]int // per key
	overlap  int            // requests of one key in flight at once
	refuse   func(a arrival) bool
}

func (o *orderingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Data struct {
			Key string `json:"key"`
			Seq int    `json:"seq"`
		} `json:"data"`
	}
	raw, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(raw, &body)
	id := r.Header.Get("webhook-id")
	o.mu.Lock()
	o.attempts[id]++
	a := arrival{key: body.Data.Key, seq: body.Data.Seq, event: id, at: time.Now(), attempt: o.attempts[id]}
	o.inFlight[a.key]++
	if o.inFlight[a.key] > 1 {
		o.overlap++
	}
	o.mu.Unlock()
	time.Sleep(2 * time.Millisecond) // the receiver's own work, so overlaps would show
	a.status = http.StatusNoContent
	if o.refuse(a) {
		a.status = http.StatusUnprocessableEntity
	}
	o.mu.Lock()
	o.inFlight[a.key]--
	o.arrivals = append(o.arrivals, a)
	o.mu.Unlock()
	w.WriteHeader(a.status)
}

// For one endpoint and one ordering key, an event is not sent before the
// one before it was delivered, even when that one needs a retry; keys do
// not wait for one another. At the default settings: the refused heads are
// retried after the schedule's first 5 s.
func TestEventsOfOneKeyAreDeliveredInOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := &orderingReceiver{attempts: map[string]int{}, inFlight: map[string]int{},
		refuse: func(a arrival) bool { return a.seq == 0 && a.attempt == 1 && a.key < "k05" }}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	_, err := f.admin.CreateEndpoint(ctx, srv.URL, []string{"order.placed"})
	require.NoError(t, err)

	// 20 keys of 6 events, interleaved, in 6 transactions: each commits
	// one event of every key. Keys k00 to k04 have their first event
	// refused once.
	const keys, perKey = 20, 6
	for seq := range perKey {
		require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			for k := range keys {
				key := fmt.Sprintf("k%02d", k)
				if _, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", OrderingKey: key,
					Data: map[string]any{"key": key, "seq": seq}}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	f.startRelay(t, relay.Config{}, nil)
	within(t, 30*time.Second, func() bool {
		s, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		return s.Delivered == keys*perKey
	}, "every event delivered")

	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Zero(t, rc.overlap, "never two requests of one key in flight at once")
	deliveredAt := map[string]map[int]time.Time{}
	firstSent := map[string]map[int]time.Time{}
	for _, a := range rc.arrivals {
		if deliveredAt[a.key] == nil {
			deliveredAt[a.key], firstSent[a.key] = map[int]time.Time{}, map[int]time.Time{}
		}
		if _, ok := firstSent[a.key][a.seq]; !ok {
			firstSent[a.key][a.seq] = a.at
		}
		if a.status == http.StatusNoContent {
			deliveredAt[a.key][a.seq] = a.at
		}
	}
	require.Len(t, deliveredAt, keys)
	for key, delivered := range deliveredAt {
		require.Len(t, delivered, perKey, key)
		for seq := 1; seq < perKey; seq++ {
			require.True(t, firstSent[key][seq].After(delivered[seq-1]),
				"%s: event %d was sent before event %d was delivered", key, seq, seq-1)
		}
	}
	// The keys whose head was refused waited for its retry, 5 s later;
	// the others did not wait for them: k19 was done before k00's head was
	// even retried. (The gap between their last deliveries, which this
	// compared before, also counts k00's own five later events, and under
	// CI's load fell under its 4 s bound without the invariant failing.)
	require.True(t, deliveredAt["k19"][perKey-1].Before(deliveredAt["k00"][0]),
		"a key waiting for its head's retry does not hold the other keys")
}

// A failed head stops only its own key: the later events of that key are
// parked (shown as such) until a person skips or retries it, while other
// keys and unkeyed events flow. Skip settles it as discarded and lets the
// next one go; retry sends it again, first.
func TestAFailedHeadHoldsItsKeyUntilSkippedOrRetried(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	var mu sync.Mutex
	poison := map[string]bool{}
	rc.respond = func(r *http.Request, _ int) int {
		mu.Lock()
		defer mu.Unlock()
		if poison[r.Header.Get("webhook-id")] {
			return http.StatusUnprocessableEntity
		}
		return http.StatusNoContent
	}
	f.endpoint(t, rc, "order.placed")
	publish := func(key string, seq int) uuid.UUID {
		return f.deliveries(t, f.publish(t, outbox.Event{Type: "order.placed", OrderingKey: key,
			Data: map[string]any{"key": key, "seq": seq}}))[0]
	}
	// Two keys whose heads always fail, each with two events behind.
	heads := map[string]uuid.UUID{}
	behind := map[string][]uuid.UUID{}
	for _, key := range []string{"skip-me", "retry-me"} {
		heads[key] = publish(key, 0)
		mu.Lock()
		poison[f.event(t, heads[key]).String()] = true
		mu.Unlock()
		behind[key] = []uuid.UUID{publish(key, 1), publish(key, 2)}
	}
	other := []uuid.UUID{publish("other", 0), publish("other", 1)}
	unkeyed := f.enqueue(t, "order.placed", map[string]any{"seq": 0})[0]

	cfg := fastConfig() // a short retry schedule: this test is about the failed state, not the wait
	cfg.MaxAttempts = 2
	f.startRelay(t, cfg, nil)
	for _, id := range append(other, unkeyed) {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "other keys and unkeyed events flow")
	}
	for key, head := range heads {
		eventually(t, func() bool { return f.status(t, head) == outbox.StatusFailed }, key+": the head fails at the cap")
	}
	for key, ids := range behind {
		for _, id := range ids {
			m := f.message(t, id)
			require.Equal(t, outbox.StatusPending, m.Status, key)
			require.True(t, m.Parked, "%s: parked behind the failed head", key)
			require.Nil(t, m.NextAttemptAt, "a parked message has no time of its own")
			require.Zero(t, m.Attempts, "%s: never sent", key)
		}
	}
	stats, err := f.admin.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, stats.Parked)
	never(t, 500*time.Millisecond, func() bool { return f.status(t, behind["skip-me"][0]) != outbox.StatusPending }, "they wait for a person")

	// Skip: the head is discarded, never sent again; the rest follow in order.
	skipped, err := f.admin.Skip(ctx, heads["skip-me"])
	require.NoError(t, err)
	require.Equal(t, outbox.StatusDiscarded, skipped.Status)
	for _, id := range behind["skip-me"] {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "skip-me: the rest delivered")
	}
	require.Equal(t, 0, rc.count(f.event(t, heads["skip-me"])), "a skipped message is never delivered")
	_, err = f.admin.Skip(ctx, heads["skip-me"])
	require.ErrorIs(t, err, admin.ErrConflict, "only failed messages can be skipped")

	// Retry, once the receiver accepts it: the head goes first.
	mu.Lock()
	poison[f.event(t, heads["retry-me"]).String()] = false
	mu.Unlock()
	_, err = f.admin.Retry(ctx, heads["retry-me"])
	require.NoError(t, err)
	for _, id := range append([]uuid.UUID{heads["retry-me"]}, behind["retry-me"]...) {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "retry-me: delivered")
	}
	// In the order the receiver accepted them: the relay's and the
	// database's clocks, which the attempt history and delivered_at are
	// read on, differ by up to a round trip's estimate, as long as the
	// gap between a recording and the next claim.
	arrived := rc.arrivals()
	head := slices.Index(arrived, f.event(t, heads["retry-me"]).String())
	next := slices.Index(arrived, f.event(t, behind["retry-me"][0]).String())
	require.True(t, head >= 0 && next >= 0, "both accepted")
	require.Less(t, head, next, "the retried head was delivered first")
}

// Two transactions writing events of one key are serialized by Enqueue: the
// second waits for the first to end, so its event is numbered (and
// delivered) after the first's, whichever began first.
func TestEnqueueSerializesTransactionsOfOneKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ev := outbox.Event{Type: "order.placed", Data: 1, OrderingKey: "o-1"}
	second, err := f.pool.Begin(ctx) // begins first, enqueues second
	require.NoError(t, err)
	defer second.Rollback(ctx) //nolint:errcheck
	first, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx) //nolint:errcheck
	firstID, err := outbox.Enqueue(ctx, first, ev)
	require.NoError(t, err)

	var secondPID uint32
	require.NoError(t, second.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&secondPID))
	done := make(chan uuid.UUID, 1)
	go func() {
		id, err := outbox.Enqueue(ctx, second, ev)
		if err != nil {
			t.Error(err)
		}
		done <- id
	}()
	eventually(t, func() bool {
		var waiting bool
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)`, secondPID).Scan(&waiting))
		return waiting
	}, "the second transaction waits on the key")
	// The clock is read after the lock is taken, not before: an event of
	// the key whose clock was read while it waited could be numbered
	// before the event of the transaction that held the lock and committed
	// first.
	var whileWaiting time.Time
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&whileWaiting))
	select {
	case <-done:
		t.Fatal("the second enqueue went ahead while the first transaction was open")
	default:
	}
	require.NoError(t, first.Commit(ctx))
	secondID := <-done
	require.NoError(t, second.Commit(ctx))
	require.Less(t, firstID.String(), secondID.String(), "ids follow commit order")
	var secondAt time.Time
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT created_at FROM outbox_events WHERE id = $1", secondID).Scan(&secondAt))
	require.True(t, secondAt.After(whileWaiting), "the waiting event's time %s is read after it got the key's lock, not before %s", secondAt, whileWaiting)

	// Another key does not wait.
	other, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx) //nolint:errcheck
	blocker, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck
	_, err = outbox.Enqueue(ctx, blocker, ev)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, other, outbox.Event{Type: "order.placed", Data: 1, OrderingKey: "o-2"})
	require.NoError(t, err, "a different key goes ahead at once")
	_, err = outbox.Enqueue(ctx, other, outbox.Event{Type: "order.placed", Data: 1})
	require.NoError(t, err, "an unkeyed event too")
}
