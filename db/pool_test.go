package db_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/dbtest"
)

func configuredPool(t *testing.T, params url.Values) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(dbtest.URL(t))
	require.NoError(t, err)
	q := u.Query()
	for k, v := range params {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	db.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A transaction a process leaves idle (it hung, or lost its network) is
// ended by the server, its locks with it: after a minute by default, or
// as the URL says.
func TestConfigurePoolEndsIdleTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var jit, idle string
	require.NoError(t, configuredPool(t, nil).QueryRow(ctx,
		"SELECT current_setting('jit'), current_setting('idle_in_transaction_session_timeout')").Scan(&jit, &idle))
	require.Equal(t, "off", jit)
	require.Equal(t, "1min", idle)

	pool := configuredPool(t, url.Values{"idle_in_transaction_session_timeout": {"100ms"}})
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	watch := configuredPool(t, nil)
	require.Eventually(t, func() bool {
		var alive bool
		err := watch.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive)
		return err == nil && !alive
	}, 10*time.Second, 10*time.Millisecond, "the server ends the idle transaction's session")
	_, err = tx.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the transaction is over")
}
