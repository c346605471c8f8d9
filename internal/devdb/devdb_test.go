package devdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestEnsureExplicitURL(t *testing.T) {
	t.Parallel()

	const u = "postgres://someone:secret@db.example:6543/app?sslmode=require"
	srv, err := Ensure(t.Context(), Options{URL: u, Logger: testLogger(t)})
	require.NoError(t, err)
	require.Equal(t, u, srv.URL)
	require.False(t, srv.Started)
	require.NoError(t, srv.Close())
}

func TestThrowawayFromInstalledBinaries(t *testing.T) {
	t.Parallel()
	requireInstalled(t)

	dir, port := clusterDir(t), freeTestPort(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	var logged strings.Builder
	srv, err := startThrowaway(ctx, Options{Dir: dir, Port: port}, slog.New(slog.NewJSONHandler(&logged, nil)), slog.LevelInfo,
		slog.String("why", "no PostgreSQL on 127.0.0.1:5432"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	require.True(t, srv.Started)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	password, ok := u.User.Password()
	require.True(t, ok, "the superuser has a password: %s", srv.URL)
	require.Len(t, password, 32)
	require.Equal(t, fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", password, port), srv.URL)
	// One line says which database is used, and why.
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	require.Len(t, lines, 1, "starting a throwaway database logs one line:\n%s", logged.String())
	require.Contains(t, lines[0], `"msg":"started throwaway PostgreSQL"`)
	require.Contains(t, lines[0], `"why":"no PostgreSQL on 127.0.0.1:5432"`)
	require.Contains(t, lines[0], fmt.Sprintf(`"port":%d`, port))

	selectOne(ctx, t, srv.URL)
	// Another local user, without the password, is refused: the cluster
	// listens on 127.0.0.1, and its superuser can run programs.
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err == nil {
		conn.Close(ctx)
	}
	require.ErrorContains(t, err, "password", "connecting without the password fails")
	require.NotContains(t, logged.String(), password, "the log redacts it")
	urlFile := filepath.Join(dir, "data", "url")
	require.Contains(t, lines[0], fmt.Sprintf(`"url_file":%q`, urlFile), "and says where the whole URL is")
	saved, err := os.ReadFile(urlFile)
	require.NoError(t, err)
	require.Equal(t, srv.URL+"\n", string(saved))
	fi, err := os.Stat(urlFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "readable by the developer only")

	// What Ensure does with a server on 127.0.0.1:5432, here on a fresh one:
	// the development database (LocalDatabase) gets created, twice is fine.
	for range 2 {
		ordersURL, err := useLocal(ctx, srv.URL)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", password, port, LocalDatabase), ordersURL)
		selectOne(ctx, t, ordersURL)
	}
	// A server that answers but refuses us is a reason to fall back.
	_, err = useLocal(ctx, fmt.Sprintf("postgres://nosuchrole@127.0.0.1:%d/postgres?sslmode=disable", port))
	var pgErr *pgconn.PgError
	require.ErrorIs(t, err, errRefused)
	require.ErrorAs(t, err, &pgErr)

	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close(), "Close is idempotent")
	requirePortClosed(t, port)
	require.NoDirExists(t, filepath.Join(dir, "data"))
}

// A run that dies without Close leaves its cluster running; the next run in
// the same Dir must stop it and start afresh.
func TestThrowawayReplacesStaleCluster(t *testing.T) {
	t.Parallel()
	requireInstalled(t)

	dir, port := clusterDir(t), freeTestPort(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	c, err := claim(Options{Dir: dir, Port: port}, mustRunAs(t))
	require.NoError(t, err)
	require.NoError(t, c.pickPort(false))
	stale, err := c.startInstalled(ctx, findInstalled())
	require.NoError(t, err)
	t.Cleanup(func() { _ = stale.Close() })
	c.release() // the owner "crashed": lock gone, server still up
	require.FileExists(t, filepath.Join(dir, "data", "postmaster.pid"))

	srv, err := startThrowaway(ctx, Options{Dir: dir, Port: port}, testLogger(t), slog.LevelInfo)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	selectOne(ctx, t, srv.URL)

	require.NoError(t, srv.Close())
	requirePortClosed(t, port)
}

// Ensure with no URL finds the local server or starts a throwaway one;
// either way the database answers.
func TestEnsureDefault(t *testing.T) {
	t.Parallel()
	if findInstalled() == "" {
		if _, err := useLocal(t.Context(), localAdminURL); err != nil {
			t.Skip("no PostgreSQL on 127.0.0.1:5432 and no PostgreSQL binaries installed")
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	srv, err := Ensure(ctx, Options{Logger: testLogger(t), Dir: clusterDir(t), Port: freeTestPort(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	if !srv.Started {
		require.Equal(t, "postgres://postgres@127.0.0.1:5432/"+LocalDatabase+"?sslmode=disable", srv.URL)
	}
	selectOne(ctx, t, srv.URL)
	require.NoError(t, srv.Close())
}

func TestUseLocalNothingListening(t *testing.T) {
	t.Parallel()

	_, err := useLocal(t.Context(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", freeTestPort(t)))
	var pgErr *pgconn.PgError
	require.ErrorIs(t, err, errRefused)
	require.False(t, errors.As(err, &pgErr))
}

func TestNewestFirst(t *testing.T) {
	t.Parallel()

	got := newestFirst([]string{
		"/opt/homebrew/opt/postgresql/bin",
		"/usr/lib/postgresql/9.6/bin",
		"/usr/lib/postgresql/16/bin",
		"/opt/homebrew/opt/postgresql@14/bin",
		"/usr/lib/postgresql/10/bin",
	})
	require.Equal(t, []string{
		"/usr/lib/postgresql/16/bin",
		"/opt/homebrew/opt/postgresql@14/bin",
		"/usr/lib/postgresql/10/bin",
		"/usr/lib/postgresql/9.6/bin",
		"/opt/homebrew/opt/postgresql/bin",
	}, got)
}

func requireInstalled(t *testing.T) {
	t.Helper()
	if findInstalled() == "" {
		t.Skip("no PostgreSQL binaries installed (looked in /usr/lib/postgresql/*/bin, /usr/local/pgsql/bin, Homebrew, PATH)")
	}
}

func mustRunAs(t *testing.T) *runAs {
	t.Helper()
	ra, err := lookupRunAs()
	require.NoError(t, err)
	return ra
}

// clusterDir returns a fresh directory the postgres OS user can reach, should
// the cluster run as that user (tests run as root).
func clusterDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// t.TempDir's parent is created 0700.
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

// freeTestPort returns a free port below Linux's ephemeral range (32768 and
// up). A port the kernel hands out for port 0 is free only until the next
// test in any package listens on port 0 or dials out, and the tests here hold
// theirs unbound for the seconds initdb takes: a CI run lost one that way.
func freeTestPort(t *testing.T) uint32 {
	t.Helper()
	for range 1000 {
		port := uint32(20000 + rand.IntN(6000))
		if portFree(port) {
			return port
		}
	}
	t.Fatal("no free port in 20000-25999")
	return 0
}

func selectOne(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "select 1").Scan(&one))
	require.Equal(t, 1, one)
}

func requirePortClosed(t *testing.T, port uint32) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err == nil {
		_ = conn.Close()
	}
	require.Error(t, err, "port %d still answers after Close", port)
}

func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
