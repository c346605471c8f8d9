// Package outboxtest helps the outbox's tests: backlogs written in one
// statement, as Enqueue would write them.
package outboxtest

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// seedSQL writes $2 events of type order.placed with the payload {"n": i},
// keyed by $3 unless it is NULL, and one pending message of each for the
// destination $1, as EventEnqueue would: one clock reading per event for its
// id, its time and its message's due time, so ids and due times follow the
// order of writing.
const seedSQL = `
WITH ev AS (
    INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
    SELECT outbox_uuid_v7_at(x.at), 'order.placed', json_build_object('n', x.g), $3::text, x.at
    FROM (SELECT g, clock_timestamp() AS at FROM generate_series(1, $2::integer) g) x
    RETURNING id, ordering_key, created_at
), m AS (
    INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, next_attempt_at, created_at)
    SELECT outbox_uuid_sibling(ev.id), ev.id, 'order.placed', $1, ev.ordering_key, ev.created_at, ev.created_at
    FROM ev
    RETURNING id
)
SELECT id FROM m ORDER BY id`

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Seed writes n events and one pending message of each for destination,
// keyed by key unless it is empty, in one statement: a backlog faster than n
// transactions of Enqueue make it. It returns the messages' ids, oldest
// first.
func Seed(t testing.TB, db querier, destination uuid.UUID, n int, key string) []uuid.UUID {
	t.Helper()
	var k *string
	if key != "" {
		k = &key
	}
	rows, err := db.Query(context.Background(), seedSQL, destination, n, k)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	return ids
}

// EndpointURL is the address Endpoint's endpoints are at: nothing listens
// there.
const EndpointURL = "http://127.0.0.1:1/"

// Endpoint inserts a webhook endpoint subscribed to order.placed at an
// address nothing listens on (EndpointURL), leased with lease when it is not nil (as a
// deliver job holding it would have it), and returns its id.
func Endpoint(t testing.TB, db querier, lease *uuid.UUID) uuid.UUID {
	t.Helper()
	rows, err := db.Query(context.Background(), `INSERT INTO webhook_endpoints (url, secret, event_types, lease_token)
		VALUES ($2, 'whsec_AAAA', '{order.placed}', $1) RETURNING id`, lease, EndpointURL)
	require.NoError(t, err)
	id, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	return id
}
