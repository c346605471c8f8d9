package process_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/proctest"
)

// readyServer serves Health with ready and returns its URL and its log.
func readyServer(t *testing.T, ready func(context.Context) error) (string, *proctest.Output) {
	t.Helper()
	logs := &proctest.Output{}
	mux := http.NewServeMux()
	process.Health(mux, process.NewLogger(logs, "json"), ready)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL, logs
}

func getReadyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// A failing /readyz says "not ready" and nothing about the database: the
// port may be public, and the pool's error names the host, the user and the
// database. The detail is in the log, once for the failure, not per probe.
func TestReadyzHidesTheDatabaseError(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(dbtest.ServerURL())
	require.NoError(t, err)
	missing := fmt.Sprintf("readyz_missing_%d", time.Now().UnixNano())
	u.Path = "/" + missing

	closed, err := pgxpool.New(context.Background(), dbtest.URL(t))
	require.NoError(t, err)
	closed.Close()

	tests := []struct {
		name   string
		pool   func(t *testing.T) *pgxpool.Pool
		detail string // what the log must hold
	}{
		{"database does not exist", func(t *testing.T) *pgxpool.Pool {
			pool, err := pgxpool.New(context.Background(), u.String())
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			return pool
		}, missing},
		{"closed pool", func(*testing.T) *pgxpool.Pool { return closed }, "closed pool"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base, logs := readyServer(t, process.PingReady(tc.pool(t)))
			for range 3 {
				code, body := getReadyz(t, base)
				require.Equal(t, http.StatusServiceUnavailable, code)
				require.Equal(t, "not ready\n", body, "the body says nothing but not ready")
				for _, secret := range []string{u.Hostname(), u.User.Username(), missing, "database"} {
					require.NotContains(t, body, secret, "the body must not name the database's host, user or name")
				}
			}
			require.Contains(t, logs.String(), tc.detail, "the log holds the reason")
			require.Equal(t, 1, strings.Count(logs.String(), `"msg":"not ready"`),
				"three failing probes log the failure once, not per probe:\n%s", logs)
		})
	}
}

// Readiness lost, regained and lost again logs each transition once.
func TestReadyzLogsTransitions(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	base, logs := readyServer(t, func(context.Context) error {
		if failing.Load() {
			return errors.New("database unreachable: host=db.internal user=orders")
		}
		return nil
	})
	for _, step := range []struct {
		fail bool
		code int
	}{{false, 200}, {true, 503}, {true, 503}, {false, 200}, {false, 200}, {true, 503}} {
		failing.Store(step.fail)
		code, body := getReadyz(t, base)
		require.Equal(t, step.code, code)
		require.NotContains(t, body, "db.internal")
	}
	require.Equal(t, 2, strings.Count(logs.String(), `"msg":"not ready"`), "one line per loss of readiness:\n%s", logs)
	require.Equal(t, 1, strings.Count(logs.String(), `"msg":"ready again"`), "one line per recovery:\n%s", logs)
	require.Contains(t, logs.String(), "db.internal", "the detail is logged")
}

// JSON logs are read by people too: a duration is written as Go writes it
// ("50ms"), not as the nanoseconds JSON would carry (50000000), in a
// group as well as at the top.
func TestJSONLogsWriteDurationsAsText(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	logger := process.NewLogger(&out, "json")
	logger.Info("relay started", "poll_interval", 50*time.Millisecond,
		slog.Group("claim", slog.Duration("timeout", 5*time.Minute)))
	require.Contains(t, out.String(), `"poll_interval":"50ms"`)
	require.Contains(t, out.String(), `"claim":{"timeout":"5m0s"}`)
	require.NotContains(t, out.String(), "50000000")
}

// A pool is the program's size unless DATABASE_URL says otherwise.
func TestOpenPoolSizeFromTheURL(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	for _, c := range []struct {
		url  string
		want int32
	}{
		{url, 20},
		{url + "&pool_max_conns=7", 7},
		// A key=value string, and a URL whose other values merely mention
		// the setting's name.
		{keyValue(t, url) + " pool_max_conns=5", 5},
		{url + "&application_name=pool_max_conns", 20},
	} {
		if !strings.Contains(url, "?") {
			c.url = strings.Replace(c.url, "&", "?", 1)
		}
		pool, err := process.OpenPool(context.Background(), c.url, 20)
		require.NoError(t, err)
		require.Equal(t, c.want, pool.Config().MaxConns, c.url)
		pool.Close()
	}
}

// keyValue writes a URL's host, port, user and database as a key=value
// connection string.
func keyValue(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	require.NoError(t, err)
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, cfg.Database)
}
