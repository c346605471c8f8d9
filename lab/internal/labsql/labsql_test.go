package labsql

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
)

func TestQueryNumbersParametersInOrderOfFirstUse(t *testing.T) {
	s := number(`SELECT @b::uuid, sqlc.narg(a)::jsonb, @b, sqlc.arg(c) WHERE x = 'no@param'`)
	require.Equal(t, `SELECT $1::uuid, $2::jsonb, $1, $3 WHERE x = 'no$4'`, s.SQL, "a quoted @ is not expected in the product's queries")
	require.Equal(t, []string{"b", "a", "c", "param"}, s.Params)
}

// The lab's statements are found, complete, in the product's query files.
func TestTheLabsStatementsExist(t *testing.T) {
	for _, q := range []struct{ module, name string }{
		{"outbox", "MessageClaim"}, {"outbox", "EventEnqueue"}, {"outbox", "MessagesPrune"}, {"outbox", "EventsPrune"},
		{"orders", "OrderInsert"}, {"orders", "OrderLinesInsert"},
	} {
		s, err := Query(q.module, q.name)
		require.NoError(t, err)
		require.NotContains(t, s.SQL, "-- name:")
		require.NotContains(t, s.SQL, "--", "comment lines are left out")
		require.NotRegexp(t, `@\w`, s.SQL, "named parameters are numbered (@> is an operator)")
		require.NotContains(t, s.SQL, "sqlc.")
		require.NotEmpty(t, s.Params)
	}
	claim := MustQuery("outbox", "MessageClaim")
	require.Equal(t, []string{"destination", "claim_token", "batch_size", "relay_id"}, claim.Params)
	args, err := claim.Args(map[string]any{"destination": 1, "claim_token": 2, "batch_size": 3, "relay_id": 4})
	require.NoError(t, err)
	require.Equal(t, []any{1, 2, 3, 4}, args)
	_, err = claim.Args(map[string]any{"destination": 1})
	require.ErrorContains(t, err, "claim_token")
	_, err = Query("outbox", "NoSuchQuery")
	require.Error(t, err)

	// sqlc.narg parameters are numbered like the others, each name once,
	// however often it is used (ordering_key is, in the lock, the event and
	// the deliveries).
	enqueue := MustQuery("outbox", "EventEnqueue")
	require.ElementsMatch(t, []string{"type", "payload", "trace_context", "ordering_key"}, enqueue.Params)
}

// EventEnqueue, as the lab runs it from the query file (a statement of
// data-modifying CTEs, one nullable parameter used three times), writes the
// event and one delivery per subscribed endpoint, as outbox.Enqueue does;
// Prune then deletes the settled delivery and its event.
func TestEventEnqueueAndPruneRunFromTheQueryFile(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var subscribed uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/a', 'whsec_a', ARRAY['order.placed']) RETURNING id`).Scan(&subscribed))
	_, err = pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/b', 'whsec_b', ARRAY['order.cancelled'])`)
	require.NoError(t, err)

	enqueue := MustQuery("outbox", "EventEnqueue")
	var ids []uuid.UUID
	for _, key := range []any{"order-1", nil} {
		args, err := enqueue.Args(map[string]any{"type": "order.placed", "payload": []byte(`{"id": "order-1"}`),
			"trace_context": nil, "ordering_key": key})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var id uuid.UUID
			if err := tx.QueryRow(ctx, enqueue.SQL, args...).Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return nil
		}))
	}
	for i, id := range ids {
		var payload string
		var destination uuid.UUID
		var key *string
		var sibling, timed bool
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT e.payload::text, m.destination, m.ordering_key,
			       m.id BETWEEN outbox_uuid_floor(e.id) AND outbox_uuid_ceil(e.id) AND m.id <> e.id,
			       m.created_at = e.created_at AND m.next_attempt_at = e.created_at
			FROM outbox_events e JOIN outbox_messages m ON m.event_id = e.id WHERE e.id = $1`, id).
			Scan(&payload, &destination, &key, &sibling, &timed))
		require.JSONEq(t, `{"id": "order-1"}`, payload)
		require.Equal(t, subscribed, destination, "one delivery, to the subscribed endpoint")
		require.True(t, sibling, "a delivery's id shares its event's first 64 bits")
		require.True(t, timed, "a new delivery is due at its event's time")
		if i == 0 {
			require.NotNil(t, key)
			require.Equal(t, "order-1", *key)
		} else {
			require.Nil(t, key)
		}
	}
	var messages int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages").Scan(&messages))
	require.Equal(t, 2, messages)

	// One delivered, one still pending: the prune takes the settled one and
	// its event, and keeps the other event with its pending delivery.
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'delivered', delivered_at = now() WHERE event_id = $1`, ids[0])
	require.NoError(t, err)
	deletedMessages, deletedEvents, err := Prune(ctx, pool, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 1, deletedMessages)
	require.EqualValues(t, 1, deletedEvents)
	var left uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, "SELECT id FROM outbox_events").Scan(&left))
	require.Equal(t, ids[1], left)
}
