// Package dbtest gives each test its own PostgreSQL database, cloned from a
// fully migrated template, so tests run in parallel against the real server
// and leave nothing behind.
//
// The server is TEST_DATABASE_URL, else DATABASE_URL, else the local default
// postgres://postgres@127.0.0.1:5432/postgres. The template is named after a
// hash of the migrations, built once and reused until they change.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/db"
)

// DefaultURL is the server tests use when no URL is configured.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	templateMu   sync.Mutex
	templateName string
)

// template returns the current template's name, building it if needed.
// stale names a template that turned out to be gone: another test binary
// built a template of a different schema (the scaffold's tests do) and
// dropped this one as stale, so it is built again.
func template(stale string) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	if templateName != "" && templateName != stale {
		return templateName, nil
	}
	name, err := ensureTemplate()
	if err != nil {
		return "", err
	}
	templateName = name
	return name, nil
}

// ServerURL returns the URL of the server tests run against.
func ServerURL() string {
	for _, name := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(name); v != "" {
			return v
		}
	}
	return DefaultURL
}

// URL creates a fresh, migrated database for t, drops it when t ends, and
// returns its URL. Before the drop, every invariant view of the schema
// (see Inconsistencies) must be empty, or t fails.
func URL(t testing.TB) string {
	t.Helper()
	u, drop, err := Create(context.Background())
	if err != nil {
		t.Fatalf("creating test database (is PostgreSQL running? see README): %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if rows, err := Inconsistencies(ctx, u); err != nil {
			t.Errorf("checking the database's invariants: %v", err)
		} else if len(rows) > 0 {
			t.Errorf("the test left rows that break an invariant of the schema:\n%s", strings.Join(rows, "\n"))
		}
		if err := drop(); err != nil {
			t.Errorf("dropping test database: %v", err)
		}
	})
	return u
}

// Create makes a fresh, migrated database and returns its URL and a func
// that drops it. Tests use URL; Create serves examples and benchmarks,
// which have no testing.T.
func Create(ctx context.Context) (string, func() error, error) {
	tmpl, err := template("")
	if err != nil {
		return "", nil, fmt.Errorf("preparing template database: %w", err)
	}
	conn, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return "", nil, fmt.Errorf("connecting to %s: %w", redact(ServerURL()), err)
	}
	defer conn.Close(ctx)
	name := "test_" + randomHex(8)
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl))
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "3D000" {
		// The template was dropped under us: build it again, once.
		if tmpl, err = template(tmpl); err != nil {
			return "", nil, fmt.Errorf("preparing template database: %w", err)
		}
		_, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl))
	}
	if err != nil {
		return "", nil, fmt.Errorf("creating test database: %w", err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, ServerURL())
		if err != nil {
			return fmt.Errorf("connecting to drop %s: %w", name, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			return fmt.Errorf("dropping %s: %w", name, err)
		}
		return nil
	}
	return withDatabaseURL(ServerURL(), name), drop, nil
}

// Inconsistencies returns, one line each, the rows of the database at url
// that break an invariant of its schema: the rows of every view of the
// current schema named *_inconsistent (outbox_messages_inconsistent, for
// one), which a module creates for the invariants its queries keep instead
// of CHECK constraints. At most 10 rows of each view are returned.
func Inconsistencies(ctx context.Context, url string) ([]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT quote_ident(table_name) FROM information_schema.views
WHERE table_schema = current_schema() AND table_name LIKE '%\_inconsistent' ORDER BY table_name`)
	views, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing invariant views: %w", err)
	}
	var found []string
	for _, view := range views {
		rows, _ := conn.Query(ctx, "SELECT to_jsonb(v)::text FROM "+view+" v LIMIT 10")
		bad, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", view, err)
		}
		for _, row := range bad {
			found = append(found, view+": "+row)
		}
	}
	return found, nil
}

// EmptyURL creates an empty database for t (no migrations: a target for a
// restore, for example), drops it when t ends, and returns its URL.
func EmptyURL(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		t.Fatalf("connecting to %s: %v", redact(ServerURL()), err)
	}
	defer conn.Close(ctx)
	name := "test_empty_" + randomHex(8)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating empty database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, ServerURL())
		if err != nil {
			t.Errorf("connecting to drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
	return withDatabaseURL(ServerURL(), name)
}

// Pool returns a pool on a fresh, migrated database for t, closed and
// dropped when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("parsing test database URL: %v", err)
	}
	db.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("opening test pool: %v", err)
	}
	// Registered after the drop, so it runs before it.
	t.Cleanup(pool.Close)
	return pool
}

// ensureTemplate builds the template database unless a current one exists.
// An advisory lock serialises test binaries of different packages, which
// `go test ./...` runs at the same time.
func ensureTemplate() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum := sha256.New()
	err := fs.WalkDir(db.Migrations, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(db.Migrations, path)
		sum.Write([]byte(path))
		sum.Write(b)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("hashing migrations: %w", err)
	}
	name := "outboxkit_template_" + hex.EncodeToString(sum.Sum(nil))[:12]

	conn, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", redact(ServerURL()), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(4242001)"); err != nil {
		return "", fmt.Errorf("locking: %w", err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock(4242001)") //nolint:errcheck

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("looking for template: %w", err)
	}
	if exists {
		return name, nil
	}
	// Build under a temporary name and rename when complete, so a crash
	// halfway never leaves a template that looks finished.
	building := name + "_building"
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", fmt.Errorf("creating template: %w", err)
	}
	pool, err := pgxpool.New(ctx, withDatabaseURL(ServerURL(), building))
	if err != nil {
		return "", err
	}
	err = db.Migrate(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrating template: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", fmt.Errorf("renaming template: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s IS_TEMPLATE true", name)); err != nil {
		return "", fmt.Errorf("marking template: %w", err)
	}
	dropStaleTemplates(ctx, conn, name)
	return name, nil
}

func withDatabaseURL(base, name string) string {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		// A key=value DSN: append the database, the last value wins.
		return fmt.Sprintf("%s dbname=%s", base, name)
	}
	u.Path = "/" + name
	return u.String()
}

func redact(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparsable url)"
	}
	return parsed.Redacted()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dropStaleTemplates removes templates of earlier schemas once a new one is
// built, so a machine keeps one template, not one per migration ever tried.
// Best effort: a template still in use by another test run stays.
func dropStaleTemplates(ctx context.Context, conn *pgx.Conn, current string) {
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database
		WHERE datname LIKE 'outboxkit\_template\_%' AND datname <> $1 AND datname NOT LIKE '%\_building'`, current)
	if err != nil {
		return
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range stale {
		_, _ = conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s IS_TEMPLATE false", name))
		_, _ = conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s", name))
	}
}
