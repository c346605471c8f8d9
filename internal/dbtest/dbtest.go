// Package dbtest gives each test its own PostgreSQL database, cloned from a
// fully migrated template, so tests run in parallel against the real server
// and leave nothing behind.
//
// The server is TEST_DATABASE_URL, else DATABASE_URL, else the local default
// postgres://postgres@127.0.0.1:5432/postgres. The template is named after
// the module and a hash of its path and its migrations, built once and
// reused until they change: copies of this template, and branches with
// other migrations, tested on one server, each keep a template of their own.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path"
	"runtime/debug"
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
// stale names a template that turned out to be gone (dropped by hand, or
// by another branch's tests as unused for a day), so it is built again.
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

// templateDB is the migrated template this module's tests clone.
type templateDB struct {
	// name is <service>_template_<hash>, the hash taken over the module
	// path, the migrations and the day (UTC): a copy of the template
	// (another module path) and a branch with other migrations (another
	// hash) each have a template of their own on a server they share. The
	// day, because the migrations cut the outbox tables into partitions
	// from the day they run to a few days ahead (migration 00038): a
	// template of last week would have none for today.
	name string
	// prefix is the name up to the hash: the templates of every version
	// of the module's migrations, which dropStaleTemplates looks through.
	prefix string
	// lock is the advisory lock of the template's builders, from its name:
	// builders of one template wait for each other, of two never do.
	lock int64
}

// templateFor is the template of module path mod at migrations, today.
func templateFor(mod string, migrations fs.FS) (templateDB, error) {
	sum := sha256.New()
	sum.Write([]byte(mod + "\n" + time.Now().UTC().Format(time.DateOnly) + "\n"))
	err := fs.WalkDir(migrations, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations, path)
		sum.Write([]byte(path))
		sum.Write(b)
		return err
	})
	if err != nil {
		return templateDB{}, fmt.Errorf("hashing migrations: %w", err)
	}
	t := templateDB{prefix: identifier(mod) + "_template_"}
	t.name = t.prefix + hex.EncodeToString(sum.Sum(nil))[:12]
	lock := sha256.Sum256([]byte(t.name))
	t.lock = int64(binary.BigEndian.Uint64(lock[:8]))
	return t, nil
}

// identifier is the last element of module path mod as the start of a
// database name: lower-case letters, digits and underscores, 20 at most.
func identifier(mod string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(path.Base(mod)) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name := b.String()
	if name == "" || name[0] < 'a' || name[0] > 'z' {
		name = "m" + name
	}
	return name[:min(len(name), 20)]
}

// modulePath is the module whose tests run: the test binary's main module.
func modulePath() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Path
	}
	return ""
}

// ensureTemplate builds the template database unless a current one exists.
// An advisory lock serialises test binaries of different packages, which
// `go test ./...` runs at the same time.
func ensureTemplate() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t, err := templateFor(modulePath(), db.Migrations)
	if err != nil {
		return "", err
	}
	migrate := func(ctx context.Context, pool *pgxpool.Pool) error {
		return db.Migrate(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	if err := buildTemplate(ctx, ServerURL(), t, migrate); err != nil {
		return "", err
	}
	return t.name, nil
}

// buildTemplate makes t on the server at serverURL with migrate, unless it
// exists, and marks it used now (see dropStaleTemplates).
func buildTemplate(ctx context.Context, serverURL string, t templateDB, migrate func(context.Context, *pgxpool.Pool) error) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", redact(serverURL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", t.lock); err != nil {
		return fmt.Errorf("locking: %w", err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", t.lock) //nolint:errcheck

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", t.name).Scan(&exists); err != nil {
		return fmt.Errorf("looking for template: %w", err)
	}
	if !exists {
		// Build under a temporary name and rename when complete, so a crash
		// halfway never leaves a template that looks finished.
		building := t.name + "_building"
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+building); err != nil {
			return fmt.Errorf("creating template: %w", err)
		}
		pool, err := pgxpool.New(ctx, withDatabaseURL(serverURL, building))
		if err != nil {
			return err
		}
		err = migrate(ctx, pool)
		pool.Close()
		if err != nil {
			return fmt.Errorf("migrating template: %w", err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, t.name)); err != nil {
			return fmt.Errorf("renaming template: %w", err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s IS_TEMPLATE true", t.name)); err != nil {
			return fmt.Errorf("marking template: %w", err)
		}
	}
	// Best effort: a template whose mark could not be written looks unused
	// to the others, and is at worst built again after a drop.
	_, _ = conn.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS '%s%s'", t.name, usedMark, time.Now().UTC().Format(time.RFC3339)))
	dropStaleTemplates(ctx, conn, t, time.Now())
	return nil
}

// usedMark begins a template's comment, which says when a test binary last
// used it.
const usedMark = "dbtest template, last used "

// staleAfter is how long a template of the module's other migrations may
// go unused before it is dropped: another branch, or another checkout,
// tested on the same server within it keeps its template.
const staleAfter = 24 * time.Hour

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

// dropStaleTemplates removes the module's templates of other migrations
// that no test binary has used for staleAfter, so a machine keeps a
// template per schema in use, not one per migration ever tried. Another
// module's templates are not its to drop, nor one of this module's that
// another branch still uses. Best effort: a template being cloned stays.
func dropStaleTemplates(ctx context.Context, conn *pgx.Conn, current templateDB, now time.Time) {
	rows, err := conn.Query(ctx, `SELECT datname, COALESCE(shobj_description(oid, 'pg_database'), '') FROM pg_database
		WHERE left(datname, length($1)) = $1 AND datname <> $2 AND datname NOT LIKE '%\_building'`, current.prefix, current.name)
	if err != nil {
		return
	}
	var stale []string
	var name, comment string
	_, err = pgx.ForEachRow(rows, []any{&name, &comment}, func() error {
		if used, err := time.Parse(time.RFC3339, strings.TrimPrefix(comment, usedMark)); err != nil || now.Sub(used) >= staleAfter {
			stale = append(stale, name)
		}
		return nil
	})
	if err != nil {
		return
	}
	for _, name := range stale {
		_, _ = conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s IS_TEMPLATE false", name))
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s", name)); err != nil {
			_, _ = conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s IS_TEMPLATE true", name))
		}
	}
}
