package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// A replay re-sends the retained events of a time range to one endpoint,
// under their original ids, only of the types it subscribes to, in bounded
// batches resumed from a cursor, and never makes a second copy of a message
// still waiting for the endpoint.
func TestReplayResendsRetainedEventsUnderTheirIDs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	before := time.Now()
	// Events written while nobody listened: recorded all the same.
	var placed []uuid.UUID
	for i := range 7 {
		placed = append(placed, f.publish(t, outbox.Event{Type: "order.placed", Data: i}))
	}
	cancelled := f.publish(t, outbox.Event{Type: "order.cancelled", Data: 7})
	other := f.publish(t, outbox.Event{Type: "customer.created", Data: 8})
	after := time.Now()
	late := f.publish(t, outbox.Event{Type: "order.placed", Data: 9}) // after the range

	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed", "order.cancelled")
	// One event already waits for the endpoint (a replay of it earlier):
	// the replay leaves it alone.
	first, err := f.admin.ReplayEvents(ctx, ep.ID, admin.Replay{From: before, To: after, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, admin.ReplayResult{Read: 1, Replayed: 1, Next: &placed[0]}, first)

	r := admin.Replay{From: before, To: after}
	n, err := f.admin.ReplayCount(ctx, ep.ID, r)
	require.NoError(t, err)
	require.Equal(t, admin.DryRun{Events: 8}, n, "the subscribed types in the range: 7 placed, 1 cancelled; the range counted to its end")

	// The rest, three at a time, from the start of the range.
	r.Limit = 3
	var read, replayed, calls int
	for {
		res, err := f.admin.ReplayEvents(ctx, ep.ID, r)
		require.NoError(t, err)
		read, replayed, calls = read+res.Read, replayed+res.Replayed, calls+1
		if res.Next == nil {
			break
		}
		r.After = res.Next
	}
	require.Equal(t, 3, calls, "bounded batches: 3 + 3 + 2")
	require.Equal(t, 8, read)
	require.Equal(t, 7, replayed, "the event already waiting is not copied")

	f.startRelay(t, relay.Config{}, nil)
	for _, id := range append(placed, cancelled) {
		eventually(t, func() bool { return rc.count(id) == 1 }, "replayed under its own event id")
	}
	require.Zero(t, rc.count(other), "a type the endpoint does not subscribe to is never replayed to it")
	require.Zero(t, rc.count(late), "an event after the range is not replayed")
	require.Equal(t, 8, rc.total())
	within(t, 10*time.Second, func() bool {
		s, err := f.admin.Stats(ctx)
		require.NoError(t, err)
		return s.Delivered == 8
	}, "every replayed message recorded delivered")

	// Once delivered, a second replay sends them again: the receiver's
	// dedup on the event id makes that harmless, and it is what replay is for.
	res, err := f.admin.ReplayEvents(ctx, ep.ID, admin.Replay{From: before, To: after, EventTypes: []string{"order.cancelled"}})
	require.NoError(t, err)
	require.Equal(t, admin.ReplayResult{Read: 1, Replayed: 1}, res, "narrowed to one type")
	eventually(t, func() bool { return rc.count(cancelled) == 2 }, "sent again, same webhook-id")
}

// A range is [From, To) to the microsecond, however close an event lies to
// either end: one written a microsecond before To is in it (its id shares
// To's millisecond, which an id bound of whole milliseconds left out), one
// written at To is not.
func TestReplayRangeIsExactAtItsEnds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ep := f.endpoint(t, newReceiver(t), "order.placed")
	for i := range 20 {
		id := f.publish(t, outbox.Event{Type: "order.placed", Data: i})
		var at time.Time
		require.NoError(t, f.pool.QueryRow(ctx, "SELECT created_at FROM outbox_events WHERE id = $1", id).Scan(&at))
		count := func(from, to time.Time) int64 {
			n, err := f.admin.ReplayCount(ctx, ep.ID, admin.Replay{From: from, To: to})
			require.NoError(t, err)
			require.Nil(t, n.Next, "a range of one event is counted in one call")
			return n.Events
		}
		us := time.Microsecond
		require.EqualValues(t, 1, count(at, at.Add(us)), "written at From and 1 µs before To: in the range")
		require.Zero(t, count(at.Add(-us), at), "written at To: after the range")
		require.Zero(t, count(at.Add(us), at.Add(time.Second)), "written 1 µs before From: before the range")
	}
}

func TestReplayRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ep := f.endpoint(t, newReceiver(t), "order.placed")
	f.publish(t, outbox.Event{Type: "order.placed", Data: 1})
	now := time.Now()
	for name, r := range map[string]admin.Replay{
		"no range":      {},
		"reversed":      {From: now, To: now.Add(-time.Hour)},
		"empty":         {From: now, To: now},
		"limit too big": {From: now.Add(-time.Hour), To: now, Limit: admin.MaxReplayBatch + 1},
		"no from":       {To: now},
		"NUL in a type": {From: now.Add(-time.Hour), To: now, EventTypes: []string{"order.placed\x00"}},
		"not UTF-8":     {From: now.Add(-time.Hour), To: now, EventTypes: []string{"order.\xff"}},
	} {
		_, err := f.admin.ReplayEvents(ctx, ep.ID, r)
		require.ErrorIs(t, err, admin.ErrInvalidReplay, name)
		_, err = f.admin.ReplayCount(ctx, ep.ID, r)
		require.ErrorIs(t, err, admin.ErrInvalidReplay, name)
	}
	_, err := f.admin.ReplayEvents(ctx, uuid.New(), admin.Replay{From: now.Add(-time.Hour), To: now.Add(time.Hour)})
	require.ErrorIs(t, err, admin.ErrNotFound)
	events, messages := countRows(t, f.pool)
	require.Equal(t, [2]int{1, 1}, [2]int{events, messages}, "the event and its one message: a refused replay writes nothing")
}

// A range reaching back before 1970, where no event id can lie, means from
// the first event: it is not an empty range.
func TestReplayFromBeforeTheEpochStartsAtTheFirstEvent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.publish(t, outbox.Event{Type: "order.placed", Data: 1})
	ep := f.endpoint(t, newReceiver(t), "order.placed") // subscribed after it: nothing waits for it yet
	r := admin.Replay{From: time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), To: time.Now().Add(time.Hour)}
	n, err := f.admin.ReplayCount(ctx, ep.ID, r)
	require.NoError(t, err)
	require.Equal(t, admin.DryRun{Events: 1}, n)
	res, err := f.admin.ReplayEvents(ctx, ep.ID, r)
	require.NoError(t, err)
	require.Equal(t, admin.ReplayResult{Read: 1, Replayed: 1}, res)
}

// A replay of a type that is rare in its range looks at a bounded number of
// the range's events per call (ten times its batch), returning a cursor even
// when it found none of its type, so no call walks the whole range.
func TestReplayScansABoundedShareOfTheRangePerCall(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	from := time.Now()
	for i := range 25 {
		f.publish(t, outbox.Event{Type: "customer.created", Data: i})
	}
	placed := f.publish(t, outbox.Event{Type: "order.placed", Data: 25})
	ep := f.endpoint(t, newReceiver(t), "order.placed")
	r := admin.Replay{From: from, To: time.Now().Add(time.Second), Limit: 1}
	var reads []int
	for {
		res, err := f.admin.ReplayEvents(ctx, ep.ID, r)
		require.NoError(t, err)
		reads = append(reads, res.Read)
		if res.Next == nil {
			break
		}
		r.After = res.Next
	}
	require.Equal(t, []int{0, 0, 1, 0}, reads, "10 events looked at, 10, then 6 with the one of its type, then none left")
	messages := f.deliveries(t, placed)
	require.Len(t, messages, 1, "the one event of its type replayed")
	require.Equal(t, outbox.StatusPending, f.status(t, messages[0]))
}

// PATCH changes an endpoint in place: same id and secret, its waiting
// messages go to the new URL, the new types apply to later events.
func TestUpdateEndpointInPlace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	oldRC, newRC := newReceiver(t), newReceiver(t)
	ep := f.endpoint(t, oldRC, "order.placed")
	newRC.setSecret(ep.Secret)
	waiting := f.enqueue(t, "order.placed", 1)[0]

	url := newRC.srv.URL + "/hook"
	changed, err := f.admin.UpdateEndpoint(ctx, ep.ID, admin.EndpointChange{URL: &url, EventTypes: []string{"order.cancelled", "order.placed"}})
	require.NoError(t, err)
	require.Equal(t, ep.ID, changed.ID)
	require.Equal(t, url, changed.URL)
	require.Equal(t, []string{"order.cancelled", "order.placed"}, changed.EventTypes)
	cancelled := f.enqueue(t, "order.cancelled", 2)
	require.Len(t, cancelled, 1, "the new type applies to events written from now on")

	f.startRelay(t, relay.Config{}, nil)
	eventually(t, func() bool {
		return f.status(t, waiting) == outbox.StatusDelivered && f.status(t, cancelled[0]) == outbox.StatusDelivered
	},
		"delivered")
	require.Equal(t, 2, newRC.total(), "to the new URL, signed with the same secret")
	require.Zero(t, oldRC.total())

	for name, c := range map[string]admin.EndpointChange{
		"no change":   {},
		"no types":    {EventTypes: []string{}},
		"blank type":  {EventTypes: []string{" "}},
		"bad url":     {URL: ptr("ftp://example.com")},
		"private url": {URL: ptr("http://10.0.0.1/hook")},
	} {
		strict := admin.New(f.pool, netguard.Guard{}, discardLogger()) // the production guard
		_, err := strict.UpdateEndpoint(ctx, ep.ID, c)
		require.ErrorIs(t, err, admin.ErrInvalidEndpoint, name)
	}
	same, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, changed.URL, same.URL, "a refused change changes nothing")
	_, err = f.admin.UpdateEndpoint(ctx, uuid.New(), admin.EndpointChange{URL: &url})
	require.ErrorIs(t, err, admin.ErrNotFound)
}

func ptr[T any](v T) *T { return &v }

// A replayed event takes its place in its key as a receiver sees it, at
// the defaults, with more messages due than the destination has slots: an
// order's placement is delivered, the endpoint is paused, the order is
// cancelled and a hundred other orders are placed, the order's range is
// replayed and the endpoint resumed. The receiver, rebuilding its state
// from the replay, must get the placement before the cancellation, or it
// ends with the order placed.
func TestAReplayedEventReachesTheReceiverBeforeItsKeysLaterEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed", "order.cancelled")
	f.startRelay(t, relay.Config{}, nil)

	from := time.Now()
	placed := f.publish(t, outbox.Event{Type: "order.placed", Data: "o", OrderingKey: "o"})
	first := f.deliveries(t, placed)
	require.Len(t, first, 1)
	// Received, then recorded: until the relay records the outcome the
	// message is in flight, and a replay leaves it be.
	eventually(t, func() bool { return rc.count(placed) == 1 && f.status(t, first[0]) == outbox.StatusDelivered },
		"the placement is delivered and recorded")
	_, err := f.admin.SetEndpointEnabled(ctx, ep.ID, false)
	require.NoError(t, err)
	cancelled := f.publish(t, outbox.Event{Type: "order.cancelled", Data: "o", OrderingKey: "o"})
	to := time.Now()
	for i := range 100 {
		f.publish(t, outbox.Event{Type: "order.placed", Data: i, OrderingKey: uuid.NewString()})
	}
	res, err := f.admin.ReplayEvents(ctx, ep.ID, admin.Replay{From: from, To: to})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed, "the placement is copied; the cancellation still waits and is not")
	_, err = f.admin.SetEndpointEnabled(ctx, ep.ID, true)
	require.NoError(t, err)

	eventually(t, func() bool { return rc.count(cancelled) == 1 && rc.count(placed) == 2 }, "both of the order's events arrive")
	var seq []string
	for _, id := range rc.arrivals() {
		if id == placed.String() || id == cancelled.String() {
			seq = append(seq, id)
		}
	}
	require.Equal(t, []string{placed.String(), placed.String(), cancelled.String()}, seq,
		"the replayed placement reaches the receiver before the order's cancellation")
}
