package process_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/process"
)

// A request whose work outlives its deadline is abandoned whole: its
// statement is cancelled, its transaction rolled back, and its client told
// so with a 503 problem, instead of the write timeout's empty reply after a
// commit the client never hears of. Here a transaction that writes a row
// and then waits on the database past a short deadline (the test is about
// the deadline; Serve's is HandlerTimeout).
func TestRequestPastItsDeadlineIsRolledBackAndAnswered503(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE deadline_probe (id int)`)
	require.NoError(t, err)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(r.Context(), `INSERT INTO deadline_probe VALUES (1)`); err != nil {
				return err
			}
			_, err := tx.Exec(r.Context(), `SELECT pg_sleep(30)`) // a database that does not answer in time
			return err
		})
		httpjson.WriteError(w, err)
	})
	srv := httptest.NewServer(process.WithDeadline(h, 300*time.Millisecond))
	t.Cleanup(srv.Close)

	start := time.Now()
	resp, err := http.Post(srv.URL, "application/json", nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Less(t, time.Since(start), 10*time.Second, "answered at the deadline, not when the database is done")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Contains(t, string(body), "took too long")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM deadline_probe`).Scan(&n))
	require.Zero(t, n, "the abandoned transaction wrote nothing")
}

// Serve gives every request's context a deadline HandlerTimeout after it
// starts, before the server's write timeout would cut the reply.
func TestServeGivesRequestsADeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	deadlines := make(chan time.Duration, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := r.Context().Deadline()
		require.True(t, ok, "the request's context has a deadline")
		deadlines <- time.Until(d)
	})
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- process.Serve(ctx, process.NewLogger(io.Discard, "json"), "test", "127.0.0.1:0", h, time.Second, ready)
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	resp, err := http.Get("http://" + <-ready)
	require.NoError(t, err)
	resp.Body.Close()
	left := <-deadlines
	require.LessOrEqual(t, left, process.HandlerTimeout)
	require.Greater(t, left, process.HandlerTimeout-5*time.Second)
}
