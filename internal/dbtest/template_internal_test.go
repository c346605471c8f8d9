package dbtest

import (
	"context"
	"fmt"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// A template is named after its module and its migrations: a copy of the
// template (another module path) and a branch (other migrations) never
// share one, nor the lock of its builders.
func TestTemplateNamesTellModulesAndMigrationsApart(t *testing.T) {
	t.Parallel()
	v1 := fstest.MapFS{"00001_a.sql": {Data: []byte("CREATE TABLE a (id int);")}}
	v2 := fstest.MapFS{"00001_a.sql": v1["00001_a.sql"], "00002_b.sql": {Data: []byte("CREATE TABLE b (id int);")}}
	of := func(mod string, migrations fstest.MapFS) templateDB {
		tmpl, err := templateFor(mod, migrations)
		require.NoError(t, err)
		require.Regexp(t, `^[a-z][a-z0-9_]*$`, tmpl.name, "a database name as it is")
		require.LessOrEqual(t, len(tmpl.name+"_building"), 63, "PostgreSQL's longest name holds it while it is built")
		return tmpl
	}
	orders, branch := of("example.org/someone/orders", v1), of("example.org/someone/orders", v2)
	copied := of("example.com/acme/orders", v1)
	shop := of("example.com/acme/Shop-API.v2", v1)
	require.Equal(t, orders, of("example.org/someone/orders", v1), "the same module and migrations: the same template")
	require.Equal(t, "orders_template_", orders.prefix)
	require.Equal(t, "shop_api_v2_template_", shop.prefix)
	for name, other := range map[string]templateDB{"a branch": branch, "a copy": copied, "another service": shop} {
		require.NotEqual(t, orders.name, other.name, "%s has a template of its own", name)
		require.NotEqual(t, orders.lock, other.lock, "%s's builders never wait for this one's", name)
	}
}

// Two copies of the template and two branches of one, tested on the same
// server, keep each other's templates: only one left unused for a day is
// dropped, and only by its own module's tests.
func TestTemplatesOfCopiesAndBranchesShareAServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ServerURL())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	migrate := func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, "CREATE TABLE t (id int)")
		return err
	}
	// Module paths of this test's own, so that no other run's templates
	// share their prefix.
	base := "t" + randomHex(6)
	v1 := fstest.MapFS{"00001_a.sql": {Data: []byte("one")}}
	v2 := fstest.MapFS{"00001_a.sql": {Data: []byte("two")}}
	build := func(mod string, migrations fstest.MapFS) templateDB {
		tmpl, err := templateFor(mod, migrations)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = conn.Exec(ctx, "ALTER DATABASE "+tmpl.name+" IS_TEMPLATE false")
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+tmpl.name)
		})
		require.NoError(t, buildTemplate(ctx, ServerURL(), tmpl, migrate))
		return tmpl
	}
	exists := func(tmpl templateDB) bool {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", tmpl.name).Scan(&ok))
		return ok
	}
	main := build("example.com/acme/"+base, v1)
	otherCopy := build("example.com/other/"+base, v1)
	branch := build("example.com/acme/"+base, v2)
	elsewhere := build("example.com/acme/"+base+"x", v1)
	for name, tmpl := range map[string]templateDB{"main": main, "another copy": otherCopy, "the branch": branch, "another service": elsewhere} {
		require.True(t, exists(tmpl), "%s's template outlives the others' builds", name)
	}

	// main's branch was last tested two days ago, and so was the other
	// service: the next build of main's module drops the branch's, never
	// the other service's.
	old := time.Now().Add(-2 * staleAfter).UTC().Format(time.RFC3339)
	for _, tmpl := range []templateDB{branch, elsewhere} {
		_, err := conn.Exec(ctx, fmt.Sprintf("COMMENT ON DATABASE %s IS '%s%s'", tmpl.name, usedMark, old))
		require.NoError(t, err)
	}
	build("example.com/acme/"+base, v1)
	require.False(t, exists(branch), "a template of the module unused for %s is dropped", staleAfter)
	require.True(t, exists(main) && exists(otherCopy), "templates in use stay")
	require.True(t, exists(elsewhere), "another module's template is not this one's to drop")

	// A test database clones a template built this way.
	name := "test_" + randomHex(8)
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, main.name))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "DROP DATABASE "+name)
	require.NoError(t, err)
}
