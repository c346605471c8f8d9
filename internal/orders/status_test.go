package orders_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/orders"
)

// The statuses an order may have are one constraint with a name a
// migration can replace (orders_status_valid, as adding a status does):
// it allows every status the module writes, and refuses any other.
func TestOrderStatusesAreTheNamedConstraint(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	insert := func(status string) error {
		_, err := pool.Exec(ctx, `INSERT INTO orders (id, customer_id, status, total_cents) VALUES ($1, 'c-1', $2, 0)`,
			uuid.New(), status)
		return err
	}
	for _, status := range []string{orders.StatusPlaced, orders.StatusCancelled} {
		require.NoError(t, insert(status), "the module writes %q", status)
	}
	var pgErr *pgconn.PgError
	require.True(t, errors.As(insert("unknown"), &pgErr), "a status the module does not know is refused")
	require.Equal(t, "orders_status_valid", pgErr.ConstraintName, "by the constraint a migration adding a status replaces")
}
