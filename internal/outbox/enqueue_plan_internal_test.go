package outbox

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// The write path finds an event's subscribers on an index, however many
// endpoints there are: with 1,000 endpoints subscribed to other types and
// two (one paused) to the event's, EventEnqueue and EventNotify read them
// through webhook_endpoints_event_types_idx, under the plans the api runs
// them with (custom at first, generic after a few executions), and the
// event gets exactly those two deliveries. Before, every event read every
// endpoint and searched its types, in the order's transaction.
func TestEnqueueFindsSubscribersOnAnIndexWith1000Endpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	rows, err := pool.Query(ctx, `
		WITH others AS (
			INSERT INTO webhook_endpoints (url, secret, event_types)
			SELECT 'http://127.0.0.1:9/' || g, 'whsec_AAAA', ARRAY['tenant' || g || '.placed', 'tenant' || g || '.cancelled']
			FROM generate_series(1, 1000) g
		)
		INSERT INTO webhook_endpoints (url, secret, event_types, enabled)
		VALUES ('http://127.0.0.1:9/a', 'whsec_AAAA', '{order.cancelled,order.placed}', true),
		       ('http://127.0.0.1:9/b', 'whsec_AAAA', '{order.placed}', false)
		RETURNING id`)
	require.NoError(t, err)
	subscribers, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ANALYZE webhook_endpoints") // as autovacuum would
	require.NoError(t, err)

	key := "order-1"
	enqueue := func(q *outboxdb.Queries) error {
		_, err := q.EventEnqueue(ctx, outboxdb.EventEnqueueParams{Type: "order.placed", Payload: []byte(`{}`), OrderingKey: &key})
		return err
	}
	// Which endpoints get a delivery, in a transaction rolled back after.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err := outboxdb.New(tx).EventEnqueue(ctx, outboxdb.EventEnqueueParams{Type: "order.placed", Payload: []byte(`{}`), OrderingKey: &key})
		require.NoError(t, err)
		rows, err := tx.Query(ctx, `SELECT destination FROM outbox_messages WHERE event_id = $1`, id)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		require.NoError(t, err)
		require.ElementsMatch(t, subscribers, got, "one delivery per subscribed endpoint, paused or not, and none for the others")
		return dbtest.ErrRollback
	})
	require.ErrorIs(t, err, dbtest.ErrRollback)

	plans := map[string]string{}
	plans["enqueue"] = trace.Explain(t, pool, queries(enqueue)) + "\n" +
		trace.ExplainGeneric(t, pool, "'order.placed'", "'{}'", "NULL", "'order-1'")
	plans["notify"] = trace.Explain(t, pool, queries(func(q *outboxdb.Queries) error { return q.EventNotify(ctx, "order.placed") })) + "\n" +
		trace.ExplainGeneric(t, pool)
	for name, plan := range plans {
		t.Logf("%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on webhook_endpoints", "%s reads every endpoint", name)
		require.Contains(t, plan, "webhook_endpoints_event_types_idx", name)
	}
}

// With the few endpoints of a new deployment, the write path reads the
// endpoints' one page, not the index: a bitmap scan of a GIN index costs
// more to set up, on every order, than reading a page. A table PostgreSQL
// has never analyzed is planned as if it had 10 pages, and autovacuum
// analyzes webhook_endpoints only after 50 changes, so the migrations
// analyze it once, while it is empty: from then on the planner scales its
// estimate with the table's pages (and the test above, with 1,000
// endpoints analyzed, still gets the index). Nothing here analyzes the
// table: the database is as the migrations left it.
func TestEnqueueReadsAFewEndpointsWithoutTheIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trace := dbtest.TracedPool(t)
	_, err := pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/a', 'whsec_AAAA', '{order.placed}'),
		       ('http://127.0.0.1:9/b', 'whsec_AAAA', '{order.placed,order.cancelled}')`)
	require.NoError(t, err)
	key := "order-1"
	trace.Explain(t, pool, queries(func(q *outboxdb.Queries) error {
		_, err := q.EventEnqueue(ctx, outboxdb.EventEnqueueParams{Type: "order.placed", Payload: []byte(`{}`), OrderingKey: &key})
		return err
	}))
	plan := trace.ExplainGeneric(t, pool, "'order.placed'", "'{}'", "NULL", "'order-1'")
	t.Logf("generic plan:\n%s", plan)
	require.Contains(t, plan, "Seq Scan on webhook_endpoints", "the api's cached plan reads the endpoints' page")
	require.NotContains(t, plan, "webhook_endpoints_event_types_idx", "the api's cached plan sets up a GIN scan for 2 endpoints")
	require.Contains(t, plan, "rows=2 loops=1", "both endpoints get their delivery")
}

// queries runs run on the queries of the transaction it is given.
func queries(run func(*outboxdb.Queries) error) func(pgx.Tx) error {
	return func(tx pgx.Tx) error { return run(outboxdb.New(tx)) }
}
