package dbtest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Statements records the SQL and arguments of every query run through a
// pool, so a test can EXPLAIN the very statements the relay runs.
type Statements struct {
	mu   sync.Mutex
	last map[string][]any // SQL → its latest arguments
	// The statement explain explained last, and its arguments.
	explained     string
	explainedArgs []any
}

func (s *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if sql := strings.ToLower(d.SQL); sql == "begin" || sql == "commit" || sql == "rollback" {
		return ctx
	}
	s.mu.Lock()
	if s.last != nil {
		s.last[d.SQL] = d.Args
	}
	s.mu.Unlock()
	return ctx
}

func (s *Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TracedPool is a pool on a database of the test's own whose statements
// are recorded, to be explained.
func TracedPool(t *testing.T) (*pgxpool.Pool, *Statements) {
	t.Helper()
	trace := &Statements{}
	return PoolTracedBy(t, trace), trace
}

// PoolTracedBy is a pool on a database of the test's own whose queries
// tracer sees.
func PoolTracedBy(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Explain runs EXPLAIN (ANALYZE, BUFFERS) of the statement that run issued,
// with its arguments, in a transaction rolled back afterwards.
func (s *Statements) Explain(t *testing.T, pool *pgxpool.Pool, run func(tx pgx.Tx) error) string {
	t.Helper()
	ctx := context.Background()
	s.mu.Lock()
	s.last = map[string][]any{}
	s.mu.Unlock()
	var plan []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, run(tx))
		s.mu.Lock()
		require.Len(t, s.last, 1, "one statement")
		var sql string
		var args []any
		for sql, args = range s.last {
		}
		s.explained, s.explainedArgs = sql, args
		s.mu.Unlock()
		plan = PlanLines(t, tx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		return ErrRollback
	})
	require.ErrorIs(t, err, ErrRollback)
	return strings.Join(plan, "\n")
}

// ExplainGeneric explains the statement Explain explained last as the
// relay runs it, under a generic plan: prepared, with its arguments as
// literals (given, or each argument written as one: see literal).
func (s *Statements) ExplainGeneric(t *testing.T, pool *pgxpool.Pool, literals ...string) string {
	t.Helper()
	s.mu.Lock()
	sql, args := s.explained, s.explainedArgs
	s.mu.Unlock()
	if literals == nil {
		for _, a := range args {
			literals = append(literals, literal(a))
		}
	}
	return explainGeneric(t, pool, sql, literals)
}

// ExplainGenericStatement explains sql under a generic plan, as
// ExplainGeneric does, with args written as literals: for statements a
// test recorded itself (every one a page load ran, say).
func ExplainGenericStatement(t *testing.T, pool *pgxpool.Pool, sql string, args []any) string {
	t.Helper()
	literals := make([]string, len(args))
	for i, a := range args {
		literals[i] = literal(a)
	}
	return explainGeneric(t, pool, sql, literals)
}

// explainGeneric runs EXPLAIN (ANALYZE, BUFFERS) of sql, prepared and
// forced to its generic plan, executed with literals, in a transaction
// rolled back afterwards.
func explainGeneric(t *testing.T, pool *pgxpool.Pool, sql string, literals []string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "PREPARE generic_check AS "+sql)
	require.NoError(t, err)
	defer conn.Exec(ctx, "DEALLOCATE generic_check") //nolint:errcheck
	var plan []string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
		require.NoError(t, err)
		execute := "EXECUTE generic_check"
		if len(literals) > 0 {
			execute += "(" + strings.Join(literals, ", ") + ")"
		}
		plan = PlanLines(t, tx, "EXPLAIN (ANALYZE, BUFFERS) "+execute, pgx.QueryExecModeSimpleProtocol)
		return ErrRollback
	})
	require.ErrorIs(t, err, ErrRollback)
	var generic int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT generic_plans FROM pg_prepared_statements WHERE name = 'generic_check'`).Scan(&generic))
	require.EqualValues(t, 1, generic, "the plan explained is the generic one")
	return strings.Join(plan, "\n")
}

// PlanLines runs an EXPLAIN on tx and returns its lines.
func PlanLines(t *testing.T, tx pgx.Tx, sql string, args ...any) []string {
	t.Helper()
	rows, err := tx.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return lines
}

// ErrRollback rolls back the transaction of an EXPLAIN ANALYZE.
var ErrRollback = errors.New("rollback")

// One runs run, which must issue exactly one statement through the traced
// pool, and returns that statement and its arguments, to be explained.
func (s *Statements) One(t *testing.T, run func() error) (sql string, args []any) {
	t.Helper()
	s.mu.Lock()
	s.last = map[string][]any{}
	s.mu.Unlock()
	require.NoError(t, run())
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.last, 1, "one statement")
	for sql, args = range s.last {
	}
	s.last = nil
	return sql, args
}

// literal writes a statement's argument as an SQL literal: NULL for a nil
// (or a nil pointer or slice), what a pointer points at, a slice as an
// array, a time in RFC 3339 (%v's form is not one PostgreSQL reads),
// anything else as its %v, quoted.
func literal(a any) string {
	v := reflect.ValueOf(a)
	for v.IsValid() && v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "NULL"
		}
		v = v.Elem()
	}
	if !v.IsValid() || v.Kind() == reflect.Slice && v.IsNil() {
		return "NULL"
	}
	text := func(a any) string {
		if tm, ok := a.(time.Time); ok {
			return tm.Format(time.RFC3339Nano)
		}
		return fmt.Sprintf("%v", a)
	}
	s := text(v.Interface())
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() != reflect.Uint8 {
		elems := make([]string, v.Len())
		for i := range elems {
			elems[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(text(v.Index(i).Interface())) + `"`
		}
		s = "{" + strings.Join(elems, ",") + "}"
	}
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Index is a pattern matching the index named in a plan, on a table or on
// any of its partitions: outbox_messages_pending_idx is
// outbox_messages_p20261207t0000_pending_idx on the partition of that day,
// outbox_messages_legacy_pending_idx on the legacy one (migration 00038).
func Index(name string) *regexp.Regexp {
	for _, table := range []string{"outbox_events", "outbox_messages", "outbox_attempts"} {
		if rest, ok := strings.CutPrefix(name, table+"_"); ok {
			return regexp.MustCompile(regexp.QuoteMeta(table) + `_(?:legacy_|p\d{8}t\d{4}_)?` + regexp.QuoteMeta(rest) + `\b`)
		}
	}
	return regexp.MustCompile(regexp.QuoteMeta(name) + `\b`)
}

// SeqScansOfHistory returns the tables of pattern (outbox_messages, and
// their partitions) that plan reads sequentially, throwing rows away: it
// reads rows it does not want, the history among them. A partition whose
// rows a statement wants every one of (a day of failed messages, all past
// their retention) is read sequentially for what it is; so is one made
// ahead of time and still empty. The plan must come from EXPLAIN ANALYZE.
func SeqScansOfHistory(t *testing.T, plan string, pattern string) []string {
	t.Helper()
	var found []string
	lines := strings.Split(plan, "\n")
	re := regexp.MustCompile(`Seq Scan on (` + pattern + `\w*)`)
	removed := regexp.MustCompile(`Rows Removed by Filter: (\d+)`)
	for i, l := range lines {
		m := re.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if strings.Contains(l, "(never executed)") {
			continue
		}
		require.Contains(t, l, "actual", "the plan of EXPLAIN ANALYZE")
		// The node's own lines follow it, indented further than it.
		indent := len(l) - len(strings.TrimLeft(l, " "))
		for _, d := range lines[i+1:] {
			if len(d)-len(strings.TrimLeft(d, " ")) <= indent || strings.Contains(d, "->") {
				break
			}
			if r := removed.FindStringSubmatch(d); r != nil && r[1] != "0" {
				found = append(found, m[1])
				break
			}
		}
	}
	return found
}

// RootBuffers is the pages a plan's root node read, hit or read from disk:
// the statement's whole reading, since a node's buffers include its
// children's. The plan must come from EXPLAIN (ANALYZE, BUFFERS). A root
// node that read nothing has no Buffers line, and neither has any node
// under it: the first one then is planning's, and the answer is 0.
func RootBuffers(t *testing.T, plan string) int {
	t.Helper()
	require.Contains(t, plan, "actual", "the plan of EXPLAIN ANALYZE:\n%s", plan)
	for _, l := range strings.Split(plan, "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "Planning") || strings.HasPrefix(trimmed, "Execution Time") {
			return 0
		}
		after, ok := strings.CutPrefix(trimmed, "Buffers: ")
		if !ok {
			continue
		}
		// "shared hit=12 read=3 dirtied=1, temp read=4": the table and
		// index pages are the shared ones.
		shared, _, _ := strings.Cut(after, ",")
		shared, ok = strings.CutPrefix(shared, "shared ")
		if !ok {
			return 0
		}
		var n int
		for _, part := range strings.Fields(shared) {
			k, v, _ := strings.Cut(part, "=")
			if k == "hit" || k == "read" {
				x, err := strconv.Atoi(v)
				require.NoError(t, err, l)
				n += x
			}
		}
		return n
	}
	t.Fatalf("no Buffers line and no Planning line in the plan:\n%s", plan)
	return 0
}
