package orders_test

// The outbox write fails for real, in the database, after the order rows
// are written: a trigger refuses the outbox row of a marked order. The whole
// transaction must roll back.

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/orders"
)

type rollbackFixture struct {
	pool *pgxpool.Pool
	svc  *orders.Service
}

// setupRollback gives an endpoint subscribed to the module's events and a trigger
// that refuses, after checking the order's own rows are written, the outbox
// row of an order of customer "refused", while refusing is on.
func setupRollback(t *testing.T) *rollbackFixture {
	t.Helper()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(context.Background(), `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/x', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', $1)`, orders.Events)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `
		CREATE TABLE refusing (on_ boolean NOT NULL);
		INSERT INTO refusing VALUES (true);
		CREATE FUNCTION refuse_outbox_row() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE
			payload json := (SELECT ev.payload FROM outbox_events ev WHERE ev.id = NEW.event_id);
		BEGIN
			IF payload->>'customer_id' = 'refused' AND (SELECT on_ FROM refusing) THEN
				-- The order's rows are there, in this transaction.
				IF NOT EXISTS (SELECT 1 FROM orders WHERE id = (payload->>'id')::uuid) THEN
					RAISE EXCEPTION 'the order is not written before its outbox row';
				END IF;
				RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'outbox row refused by the test';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_outbox_row AFTER INSERT ON outbox_messages FOR EACH ROW EXECUTE FUNCTION refuse_outbox_row();`)
	require.NoError(t, err)
	return &rollbackFixture{pool: pool, svc: orders.NewService(pool, slog.New(slog.DiscardHandler))}
}

func (f *rollbackFixture) counts(t *testing.T) [3]int {
	t.Helper()
	var n [3]int
	require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM orders), (SELECT count(*) FROM order_lines),
		(SELECT count(*) FROM outbox_events) + (SELECT count(*) FROM outbox_messages)`).
		Scan(&n[0], &n[1], &n[2]))
	n[2] /= 2 // an event and its one message
	return n
}

func (f *rollbackFixture) refuse(t *testing.T, on bool) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), "UPDATE refusing SET on_ = $1", on)
	require.NoError(t, err)
}

func requireRefused(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "outbox row refused by the test", pgErr.Message)
}

var refused = orders.PlaceRequest{CustomerID: "refused", Lines: []orders.Line{{SKU: "A-1", Quantity: 2, UnitPriceCents: 500}}}

func TestPlaceRollsBackWhenTheOutboxWriteFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, req := range map[string]orders.PlaceRequest{
		"without key": refused,
		"with key":    {CustomerID: refused.CustomerID, Lines: refused.Lines, IdempotencyKey: "k-1"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setupRollback(t)
			order, replayed, err := f.svc.Place(ctx, req)
			requireRefused(t, err)
			require.Zero(t, order)
			require.False(t, replayed)
			require.Equal(t, [3]int{0, 0, 0}, f.counts(t), "no order, no lines, no outbox row")

			// Nothing half-done is left behind: the same request, key
			// included, now places the order as if for the first time.
			f.refuse(t, false)
			_, replayed, err = f.svc.Place(ctx, req)
			require.NoError(t, err)
			require.False(t, replayed)
			require.Equal(t, [3]int{1, 1, 1}, f.counts(t))
		})
	}
}

func TestCancelRollsBackWhenTheOutboxWriteFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupRollback(t)
	f.refuse(t, false)
	placed, _, err := f.svc.Place(ctx, refused)
	require.NoError(t, err)

	f.refuse(t, true)
	cancelled, err := f.svc.Cancel(ctx, placed.ID)
	requireRefused(t, err)
	require.Zero(t, cancelled)
	got, err := f.svc.Get(ctx, placed.ID)
	require.NoError(t, err)
	require.Equal(t, placed, got, "the order is still placed, untouched")
	require.Equal(t, [3]int{1, 1, 1}, f.counts(t), "only order.placed is in the outbox")

	f.refuse(t, false)
	cancelled, err = f.svc.Cancel(ctx, placed.ID)
	require.NoError(t, err)
	require.Equal(t, orders.StatusCancelled, cancelled.Status)
	require.Equal(t, [3]int{1, 1, 2}, f.counts(t))
}

// A replay, a second cancel, an unknown order and an invalid request emit
// nothing: with every outbox write refused, they still succeed or fail on
// their own terms.
func TestWhatEmitsNothingWritesNoOutboxRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setupRollback(t)
	f.refuse(t, false)
	key := orders.PlaceRequest{CustomerID: refused.CustomerID, Lines: refused.Lines, IdempotencyKey: "k-1"}
	placed, _, err := f.svc.Place(ctx, key)
	require.NoError(t, err)
	_, err = f.svc.Cancel(ctx, placed.ID)
	require.NoError(t, err)

	f.refuse(t, true)
	_, replayed, err := f.svc.Place(ctx, key)
	require.NoError(t, err)
	require.True(t, replayed)
	_, err = f.svc.Cancel(ctx, placed.ID)
	require.NoError(t, err)
	_, err = f.svc.Cancel(ctx, uuid.New())
	require.ErrorIs(t, err, orders.ErrNotFound)
	_, _, err = f.svc.Place(ctx, orders.PlaceRequest{CustomerID: "refused"})
	var invalid *orders.ValidationError
	require.ErrorAs(t, err, &invalid)
	require.Equal(t, [3]int{1, 1, 2}, f.counts(t))
}
