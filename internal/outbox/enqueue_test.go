package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

// countRows counts the outbox's events and messages.
func countRows(t *testing.T, pool *pgxpool.Pool) (events, messages int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM outbox_events), (SELECT count(*) FROM outbox_messages)").Scan(&events, &messages))
	return events, messages
}

func TestEnqueueRefusesAnythingButAnOpenTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	ev := outbox.Event{Type: "order.placed", Data: map[string]int{"n": 1}}

	committed, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, committed.Commit(ctx))
	rolledBack, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, rolledBack.Rollback(ctx))
	var typedNil *pgxpool.Tx

	for name, tx := range map[string]pgx.Tx{
		"nil":         nil,
		"typed nil":   typedNil,
		"committed":   committed,
		"rolled back": rolledBack,
	} {
		id, err := outbox.Enqueue(ctx, tx, ev)
		require.ErrorIs(t, err, outbox.ErrNotInTx, name)
		require.Equal(t, uuid.Nil, id, name)
	}
	events, messages := countRows(t, f.pool)
	require.Zero(t, events+messages, "a refused enqueue writes nothing")
}

func TestEnqueueRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for name, ev := range map[string]outbox.Event{
		"empty type":            {Type: "", Data: 1},
		"unencodable data":      {Type: "order.placed", Data: make(chan int)},
		"unencodable number":    {Type: "order.placed", Data: map[string]any{"x": func() {}}},
		"ordering key too long": {Type: "order.placed", Data: 1, OrderingKey: strings.Repeat("k", 201)},
	} {
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, ev)
			return err
		})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
	}
	events, messages := countRows(t, f.pool)
	require.Zero(t, events+messages, "an invalid event writes nothing")
}

// One event, and one message per subscribed endpoint, paused ones included:
// disabled means paused, and their rows wait to be delivered after they are
// enabled. Every message carries the event's id; an event nobody
// subscribes to is recorded all the same.
func TestEnqueueFansOutToSubscribedEndpoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a, b, c, d := newReceiver(t), newReceiver(t), newReceiver(t), newReceiver(t)
	epA := f.endpoint(t, a, "order.placed", "order.cancelled")
	epB := f.endpoint(t, b, "order.placed")
	f.endpoint(t, c, "order.cancelled")
	epD := f.endpoint(t, d, "order.placed")
	_, err := f.admin.SetEndpointEnabled(ctx, epD.ID, false)
	require.NoError(t, err)

	event := f.publish(t, outbox.Event{Type: "order.placed", Data: map[string]string{"order": "o-1"}})
	require.Equal(t, uuid.Version(7), event.Version(), "event ids are UUIDv7: time-ordered")
	ids := f.deliveries(t, event)
	require.Len(t, ids, 3, "one row per subscribed endpoint, the paused one included")
	dests := map[string]bool{}
	for _, id := range ids {
		m := f.message(t, id)
		require.Equal(t, outbox.StatusPending, m.Status)
		require.Equal(t, event, m.EventID, "every delivery carries the event's id")
		require.NotEqual(t, event, m.ID, "and has its own")
		require.JSONEq(t, `{"order":"o-1"}`, string(m.Payload))
		dests[m.Destination.String()] = true
	}
	require.Equal(t, map[string]bool{epA.ID.String(): true, epB.ID.String(): true, epD.ID.String(): true}, dests)

	unheard := f.publish(t, outbox.Event{Type: "customer.created", Data: 1})
	require.Empty(t, f.deliveries(t, unheard), "nobody subscribes: nothing to send")
	var typ string
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT type FROM outbox_events WHERE id = $1", unheard).Scan(&typ))
	require.Equal(t, "customer.created", typ, "but the event is recorded, for a later replay")
}

func TestEnqueueRollsBackWithTheTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: 1})
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, err)
	events, messages := countRows(t, f.pool)
	require.Zero(t, events+messages, "the event and its message share the transaction's fate")
}

// Queue's statement shares the batch, and the transaction, of the caller's:
// when one of the caller's statements fails, the event is not written
// either; when the batch succeeds, the event is written as Enqueue writes
// it. An invalid event is refused before anything is queued.
func TestQueueSharesTheCallersBatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	ep := f.endpoint(t, rc, "order.placed")

	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue("SELECT 1 / 0")
		q, err := outbox.Queue(ctx, tx, &b, outbox.Event{Type: "order.placed", Data: 1})
		require.NoError(t, err)
		err = tx.SendBatch(ctx, &b).Close()
		require.Equal(t, uuid.Nil, q.ID(), "a statement after a failed one does not run")
		return err
	})
	require.ErrorContains(t, err, "division by zero")
	events, messages := countRows(t, f.pool)
	require.Zero(t, events+messages, "the caller's failed statement takes the event with it")

	var b pgx.Batch
	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Queue(ctx, tx, &b, outbox.Event{Type: "", Data: 1})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	_, err = outbox.Queue(ctx, nil, &b, outbox.Event{Type: "order.placed", Data: 1})
	require.ErrorIs(t, err, outbox.ErrNotInTx)
	require.Zero(t, b.Len(), "a refused event queues nothing")

	b.Queue("SELECT 1")
	q, err := outbox.Queue(ctx, tx, &b, outbox.Event{Type: "order.placed", Data: map[string]int{"n": 1}, OrderingKey: "k"})
	require.NoError(t, err)
	require.NoError(t, tx.SendBatch(ctx, &b).Close())
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, uuid.Version(7), q.ID().Version())
	ids := f.deliveries(t, q.ID())
	require.Len(t, ids, 1)
	m := f.message(t, ids[0])
	require.Equal(t, ep.ID, m.Destination)
	require.Equal(t, outbox.StatusPending, m.Status)
	require.JSONEq(t, `{"n":1}`, string(m.Payload))
}

// An event whose time no partition of the outbox tables holds (the
// worker's prune job has not made them for that long) is refused with an
// error that says so, and the transaction writes nothing.
func TestEnqueueWithoutAPartitionSaysSo(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")
	var suffix string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT suffix FROM outbox_partitions()
		WHERE (lo IS NULL OR lo <= outbox_uuid_v7()) AND outbox_uuid_v7() < hi`).Scan(&suffix))
	_, err := f.pool.Exec(ctx, `DROP TABLE outbox_attempts_`+suffix+`, outbox_messages_`+suffix+`, outbox_events_`+suffix)
	require.NoError(t, err)

	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: 1})
		return err
	})
	require.ErrorIs(t, err, outbox.ErrNoPartition)
	require.ErrorContains(t, err, "is a worker running?")
	events, messages := countRows(t, f.pool)
	require.Zero(t, events+messages)
}
