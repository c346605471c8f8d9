package db_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/dbtest"
)

// uuid.UUID round-trips through a ConfigurePool pool as it did through
// pgx's driver.Valuer and sql.Scanner path: in binary and in text, alone,
// by pointer, in arrays, and NULL.
func TestConfigurePoolRoundTripsUUIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	db.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	id, other := uuid.New(), uuid.MustParse("01a23253-c930-7d68-b9d5-41109cd69449")
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		var got uuid.UUID
		var text string
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::uuid, $1::uuid::text", mode, id).Scan(&got, &text))
		require.Equal(t, id, got, mode)
		require.Equal(t, id.String(), text, "the server reads the id the client sent (%v)", mode)

		var ptr *uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::uuid", mode, &other).Scan(&ptr))
		require.Equal(t, &other, ptr, mode)
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::uuid", mode, (*uuid.UUID)(nil)).Scan(&ptr))
		require.Nil(t, ptr, "NULL scans into a nil pointer (%v)", mode)
		got = id
		require.NoError(t, pool.QueryRow(ctx, "SELECT NULL::uuid", mode).Scan(&got))
		require.Equal(t, uuid.Nil, got, "NULL scans into the zero id, as uuid.UUID.Scan does (%v)", mode)

		var ids []uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::uuid[]", mode, []uuid.UUID{id, other}).Scan(&ids))
		require.Equal(t, []uuid.UUID{id, other}, ids, mode)
	}
}
