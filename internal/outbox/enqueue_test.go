package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

func countMessages(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_messages").Scan(&n))
	return n
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
		ids, err := outbox.Enqueue(ctx, tx, ev)
		require.ErrorIs(t, err, outbox.ErrNotInTx, name)
		require.Empty(t, ids, name)
	}
	require.Zero(t, countMessages(t, f.pool), "a refused enqueue writes nothing")
}

func TestEnqueueRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for name, ev := range map[string]outbox.Event{
		"empty type":         {Type: "", Data: 1},
		"unencodable data":   {Type: "order.placed", Data: make(chan int)},
		"unencodable number": {Type: "order.placed", Data: map[string]any{"x": func() {}}},
	} {
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, ev)
			return err
		})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
	}
}

// One row per subscribed endpoint, paused ones included: disabled means
// paused, and their rows wait to be delivered after they are enabled.
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

	ids := f.enqueue(t, "order.placed", map[string]string{"order": "o-1"})
	require.Len(t, ids, 3, "one row per subscribed endpoint, the paused one included")
	dests := map[string]bool{}
	for _, id := range ids {
		m := f.message(t, id)
		require.Equal(t, outbox.StatusPending, m.Status)
		require.JSONEq(t, `{"order":"o-1"}`, string(m.Payload))
		dests[m.Destination.String()] = true
	}
	require.Equal(t, map[string]bool{epA.ID.String(): true, epB.ID.String(): true, epD.ID.String(): true}, dests)

	require.Empty(t, f.enqueue(t, "customer.created", 1), "nobody subscribes: nothing to send")
}

func TestEnqueueRollsBackWithTheTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	f.endpoint(t, rc, "order.placed")

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: 1})
	require.NoError(t, err)
	require.Len(t, ids, 1)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, countMessages(t, f.pool), "the message shares the transaction's fate")
}
