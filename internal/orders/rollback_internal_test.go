package orders

// An internal test: it replaces the unexported enqueue, the only fake the
// service allows, to fail after the order rows (and real outbox rows) are
// written, and proves the whole transaction rolls back.

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/stretchr/testify/require"
)

var errEnqueue = errors.New("enqueue failed")

type rollbackFixture struct {
	pool *pgxpool.Pool
	real *Service // enqueues for real
	// failing enqueues for real, checks the order is visible in the
	// transaction, then fails: everything it saw must roll back.
	failing *Service
	calls   int
}

func setup(t *testing.T) *rollbackFixture {
	t.Helper()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(context.Background(),
		`INSERT INTO webhook_endpoints (url, secret, event_types)
		 VALUES ('http://127.0.0.1:9/x', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '{order.placed,order.cancelled}')`)
	require.NoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	f := &rollbackFixture{pool: pool, real: NewService(pool, logger), failing: NewService(pool, logger)}
	f.failing.enqueue = func(ctx context.Context, tx pgx.Tx, ev outbox.Event) ([]uuid.UUID, error) {
		f.calls++
		ids, err := outbox.Enqueue(ctx, tx, ev)
		require.NoError(t, err)
		require.Len(t, ids, 1, "the outbox row is written before the failure")
		order := ev.Data.(Order)
		var status string
		require.NoError(t, tx.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, order.ID).Scan(&status))
		require.Equal(t, order.Status, status, "the order change is written before the failure")
		return nil, errEnqueue
	}
	return f
}

func (f *rollbackFixture) counts(t *testing.T) [3]int {
	t.Helper()
	var n [3]int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM orders), (SELECT count(*) FROM order_lines), (SELECT count(*) FROM outbox_messages)`).
		Scan(&n[0], &n[1], &n[2]))
	return n
}

var request = PlaceRequest{CustomerID: "c-1", Lines: []Line{{SKU: "A-1", Quantity: 2, UnitPriceCents: 500}}}

func TestPlaceRollsBackWhenEnqueueFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, req := range map[string]PlaceRequest{
		"without key": request,
		"with key":    {CustomerID: request.CustomerID, Lines: request.Lines, IdempotencyKey: "k-1"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			order, replayed, err := f.failing.Place(ctx, req)
			require.ErrorIs(t, err, errEnqueue)
			require.Zero(t, order)
			require.False(t, replayed)
			require.Equal(t, 1, f.calls)
			require.Equal(t, [3]int{0, 0, 0}, f.counts(t), "no order, no lines, no outbox row")

			// Nothing half-done is left behind: the same request, key
			// included, now places the order as if for the first time.
			order, replayed, err = f.real.Place(ctx, req)
			require.NoError(t, err)
			require.False(t, replayed)
			require.Equal(t, [3]int{1, 1, 1}, f.counts(t))
		})
	}
}

func TestCancelRollsBackWhenEnqueueFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	placed, _, err := f.real.Place(ctx, request)
	require.NoError(t, err)

	cancelled, err := f.failing.Cancel(ctx, placed.ID)
	require.ErrorIs(t, err, errEnqueue)
	require.Zero(t, cancelled)
	require.Equal(t, 1, f.calls)

	got, err := f.real.Get(ctx, placed.ID)
	require.NoError(t, err)
	require.Equal(t, placed, got, "the order is still placed, untouched")
	require.Equal(t, [3]int{1, 1, 1}, f.counts(t), "only order.placed is in the outbox")

	cancelled, err = f.real.Cancel(ctx, placed.ID)
	require.NoError(t, err)
	require.Equal(t, StatusCancelled, cancelled.Status)
	require.Equal(t, [3]int{1, 1, 2}, f.counts(t))
}

func TestEnqueueIsNotCalledForWhatEmitsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	placed, _, err := f.real.Place(ctx, PlaceRequest{CustomerID: "c-1", Lines: request.Lines, IdempotencyKey: "k-1"})
	require.NoError(t, err)
	_, err = f.real.Cancel(ctx, placed.ID)
	require.NoError(t, err)

	// A replay, a second cancel, an unknown order and an invalid request
	// all succeed or fail without enqueueing: the failing enqueue is never
	// reached.
	_, replayed, err := f.failing.Place(ctx, PlaceRequest{CustomerID: "c-1", Lines: request.Lines, IdempotencyKey: "k-1"})
	require.NoError(t, err)
	require.True(t, replayed)
	_, err = f.failing.Cancel(ctx, placed.ID)
	require.NoError(t, err)
	_, err = f.failing.Cancel(ctx, uuid.New())
	require.ErrorIs(t, err, ErrNotFound)
	_, _, err = f.failing.Place(ctx, PlaceRequest{CustomerID: "c-1"})
	var invalid *ValidationError
	require.ErrorAs(t, err, &invalid)
	require.Zero(t, f.calls)
	require.Equal(t, [3]int{1, 1, 2}, f.counts(t))
}
