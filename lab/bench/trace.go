package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtTracer sums client-observed time per statement (by its sqlc name or
// first words): set BENCH_TRACE=1 to print it after each relay stops.
type stmtTracer struct {
	mu    sync.Mutex
	total map[string]time.Duration
	count map[string]int
}

type traceKey struct{}

type traceStart struct {
	name string
	at   time.Time
}

func newStmtTracer() *stmtTracer {
	return &stmtTracer{total: map[string]time.Duration{}, count: map[string]int{}}
}

func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := strings.TrimSpace(d.SQL)
	if strings.HasPrefix(name, "-- name: ") {
		name = strings.Fields(name)[2]
	} else if len(name) > 40 {
		name = name[:40]
	}
	return context.WithValue(ctx, traceKey{}, traceStart{name, time.Now()})
}

func (t *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	t.mu.Lock()
	t.total[s.name] += time.Since(s.at)
	t.count[s.name]++
	t.mu.Unlock()
}

func (t *stmtTracer) print() {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for n := range t.total {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return t.total[names[i]] > t.total[names[j]] })
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "    %-45q %6d calls %10s total %8s avg\n", n, t.count[n], t.total[n].Round(time.Millisecond), (t.total[n] / time.Duration(t.count[n])).Round(time.Microsecond))
	}
}
