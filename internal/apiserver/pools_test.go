package apiserver_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/dbtest"
)

// Admin reads have connections of their own: however many wait (here on a
// lock, as expensive reads wait on the disk), an order is placed at once
// beside them. They shared the orders' pool, four connections on a small
// machine, and forty heavy reads at once made a POST /orders wait for one
// for seconds. A read that waits past ADMIN_STATEMENT_TIMEOUT is cancelled
// and answered 503, as one past the request's deadline is.
func TestOrdersArePlacedWhileAdminReadsWait(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	sized, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := sized.Query()
	q.Set("pool_max_conns", "4") // the api's pool on a machine of up to 4 cores
	sized.RawQuery = q.Encode()
	tok := strings.Repeat("k", 32)
	s := setup(t, map[string]string{"DATABASE_URL": sized.String(), "ADMIN_TOKEN": tok, "ADMIN_STATEMENT_TIMEOUT": "1s"})

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	// GET /outbox/relays reads outbox_relays, which placing an order never
	// touches: every such read now waits for this transaction.
	_, err = tx.Exec(ctx, `LOCK TABLE outbox_relays IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	// More than the orders' pool of 4, which they shared, and than the
	// admin pool's connections.
	const reads = 6
	codes := make(chan int, reads)
	var wg sync.WaitGroup
	for range reads {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodGet, s.url+"/outbox/relays", nil)
			if err != nil {
				codes <- 0
				return
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := contracttest.Client(t, &http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	var waiting int
	require.Eventually(t, func() bool {
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			WHERE c.relname = 'outbox_relays' AND NOT l.granted`).Scan(&waiting))
		return waiting > 0
	}, 10*time.Second, 10*time.Millisecond, "the admin reads wait on the lock")

	start := time.Now()
	resp, body := send(t, http.MethodPost, s.url+"/orders", map[string]string{"Content-Type": "application/json"}, orderBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	require.Less(t, time.Since(start), 2*time.Second, "the order did not wait for the admin reads' connections")

	wg.Wait()
	close(codes)
	for code := range codes {
		require.Equal(t, http.StatusServiceUnavailable, code, "a read that waits past the admin statement timeout is cancelled: 503")
	}
}
