package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// discard is the logger every component gets: logging is not what is measured.
var discard = slog.New(slog.DiscardHandler)

// database is a fresh, migrated database made for one scenario and dropped after.
type database struct {
	url  string
	drop func() error
}

func newDatabase(ctx context.Context) (*database, error) {
	d, err := newMigratedDatabase(ctx)
	if err != nil {
		return nil, err
	}
	if err := d.steadyPartitions(ctx); err != nil {
		_ = d.drop()
		return nil, err
	}
	return d, nil
}

// newMigratedDatabase is a fresh database as the migrations leave it: the
// few partitions of its first days.
func newMigratedDatabase(ctx context.Context) (*database, error) {
	u, drop, err := dbtest.Create(ctx)
	if err != nil {
		return nil, err
	}
	return &database{url: u, drop: drop}, nil
}

// steadyPartitions gives the fresh database the partitions a worker at the
// defaults keeps once it has run for its retention, instead of the few a
// migration makes: relay.DefaultConfig's span, from the one that holds the
// time a retention ago (older ones are dropped) through PartitionsAhead.
// Every statement on the outbox tables opens each partition, so the
// scenarios measure what a service pays at its steady state, and the
// history they preload, within the retention, lands in a partition of its
// own time. The migration's partitions, empty in a fresh database, are
// dropped first.
func (d *database) steadyPartitions(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	cfg := relay.DefaultConfig()
	_, err = conn.Exec(ctx, `
		DO $$
		DECLARE p record;
		BEGIN
		  FOR p IN SELECT suffix FROM outbox_partitions() LOOP
		    EXECUTE format('DROP TABLE %I, %I, %I', 'outbox_attempts_' || p.suffix, 'outbox_messages_' || p.suffix,
		                   'outbox_events_' || p.suffix);
		  END LOOP;
		END $$`)
	if err != nil {
		return fmt.Errorf("dropping the migration's partitions: %w", err)
	}
	_, err = conn.Exec(ctx, `
		WITH s AS (SELECT make_interval(secs => $1) AS span),
		oldest AS (SELECT date_bin(s.span, now() - make_interval(secs => $2), timestamptz '1970-01-01 00:00:00+00') AS lo, s.span FROM s)
		SELECT outbox_partition_create(lo, lo + span) FROM oldest`,
		cfg.PartitionSpan.Seconds(), cfg.Retention.Seconds())
	if err != nil {
		return fmt.Errorf("making the oldest partition: %w", err)
	}
	_, err = conn.Exec(ctx, `SELECT outbox_partitions_extend(now() + make_interval(secs => $1), make_interval(secs => $2))`,
		cfg.PartitionsAhead.Seconds(), cfg.PartitionSpan.Seconds())
	if err != nil {
		return fmt.Errorf("making the partitions a worker keeps: %w", err)
	}
	return nil
}

func (d *database) pool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	db.ConfigurePool(cfg)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// notifyPool is a pool whose connections are made with outbox.NotifyRelays,
// as the api's are with OUTBOX_NOTIFY=true: every Enqueue (EventEnqueue) on
// it NOTIFYs listening relays at commit.
func (d *database) notifyPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	db.ConfigurePool(cfg)
	outbox.NotifyRelays(cfg.ConnConfig)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// addEndpoints registers n endpoints for order.placed, all at url.
func addEndpoints(ctx context.Context, pool *pgxpool.Pool, n int, url string) error {
	_, err := pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		SELECT $1, 'whsec_'||encode(sha256(g::text::bytea), 'base64'), ARRAY['order.placed']
		FROM generate_series(1, $2) g`, url, n)
	return err
}

// preloadPending inserts n pending messages spread over every endpoint, each
// the one delivery of its own event with an order-sized payload, in one
// INSERT … SELECT generate_series. Ids, times and due times are as
// EventEnqueue writes them: the event's id is a UUIDv7 of its time, its
// delivery's id shares the event's first 64 bits, and the delivery is due
// at the event's time.
func preloadPending(ctx context.Context, pool *pgxpool.Pool, n int) error {
	_, err := pool.Exec(ctx, `
		WITH e AS (SELECT array_agg(id ORDER BY id) AS ids FROM webhook_endpoints),
		src AS MATERIALIZED (
			SELECT g, t.at, outbox_uuid_v7_at(t.at) AS id
			FROM (SELECT g, clock_timestamp() AS at FROM generate_series(1, $1::int) g) t
		), ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT src.id, 'order.placed',
			       jsonb_build_object('id', gen_random_uuid(), 'customer_id', 'c-' || g, 'status', 'placed',
			                          'total_cents', 1000, 'created_at', src.at,
			                          'lines', jsonb_build_array(
			                              jsonb_build_object('sku', 'A-1', 'quantity', 1, 'unit_price_cents', 500),
			                              jsonb_build_object('sku', 'B-2', 'quantity', 1, 'unit_price_cents', 500)))::json,
			       src.at
			FROM src
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(src.id), src.id, 'order.placed', e.ids[1 + g % cardinality(e.ids)], src.at, src.at
		FROM e, src`, n)
	if err != nil {
		return fmt.Errorf("preloading %d pending messages: %w", n, err)
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE outbox_events, outbox_messages")
	return err
}

// preloadDelivered inserts n delivered rows of history, each with its
// event, in chunks, written and delivered a millisecond apart from at on.
func preloadDelivered(ctx context.Context, pool *pgxpool.Pool, n int, at time.Time) error {
	const chunk = 500_000
	for done := 0; done < n; done += chunk {
		m := min(chunk, n-done)
		_, err := pool.Exec(ctx, `
			WITH e AS (SELECT array_agg(id ORDER BY id) AS ids FROM webhook_endpoints),
			src AS MATERIALIZED (
				SELECT g, t.at, outbox_uuid_v7_at(t.at) AS id
				FROM (SELECT g, $2::timestamptz + ($3 + g) * interval '1 ms' AS at
				      FROM generate_series(1, $1::int) g) t
			), ev AS (
				INSERT INTO outbox_events (id, type, payload, created_at)
				SELECT src.id, 'order.placed',
				       jsonb_build_object('id', gen_random_uuid(), 'customer_id', 'c-' || g, 'status', 'placed',
				                          'total_cents', 1000, 'lines', jsonb_build_array(
				                              jsonb_build_object('sku', 'A-1', 'quantity', 1, 'unit_price_cents', 500)))::json,
				       src.at
				FROM src
			)
			INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, next_attempt_at, delivered_at, created_at)
			SELECT outbox_uuid_sibling(src.id), src.id, 'order.placed', e.ids[1 + g % cardinality(e.ids)],
			       'delivered', 1, src.at, src.at, src.at
			FROM e, src`, m, at, done)
		if err != nil {
			return fmt.Errorf("preloading %d delivered messages: %w", n, err)
		}
	}
	_, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_events, outbox_messages")
	return err
}

// resetOutbox empties the outbox (events, messages and their attempts) and
// River's job table between runs.
func resetOutbox(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, "TRUNCATE outbox_attempts, outbox_messages, outbox_events, river_job")
	return err
}

// unsettled reports whether any message is still pending or claimed.
func unsettled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var any bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE status = 'pending')
		OR EXISTS (SELECT 1 FROM outbox_messages WHERE status = 'claimed')`).Scan(&any)
	return any, err
}

// waitDrained polls until nothing is pending or claimed and returns when
// that was first seen; it gives up at limit.
func waitDrained(ctx context.Context, pool *pgxpool.Pool, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		busy, err := unsettled(ctx, pool)
		if err != nil {
			return time.Time{}, err
		}
		if !busy {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("outbox not drained within %s", limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func countStatus(ctx context.Context, pool *pgxpool.Pool, status string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages WHERE status = $1", status).Scan(&n)
	return n, err
}

// noopTransport answers 200 to everything without sending: the relay's own
// cost, with no network.
type noopTransport struct{}

func (noopTransport) Deliver(context.Context, relay.Delivery) relay.Result {
	return relay.Result{StatusCode: http.StatusOK}
}

// receiver is a local webhook receiver on loopback: it answers 204 after
// delay, counts requests and distinct webhook-ids (duplicates), and, when
// asked, records when each order's webhook arrived.
type receiver struct {
	srv      *http.Server
	url      string
	delay    time.Duration
	requests atomic.Int64

	mu       sync.Mutex
	ids      map[string]struct{}
	trackIDs bool
	arrivals map[string]time.Time // order id → arrival
	trackArr bool
	// latest: an order's arrival is its last webhook's (to several
	// endpoints), not its first.
	latest bool
}

func newReceiver(delay time.Duration) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &receiver{delay: delay, url: "http://" + ln.Addr().String() + "/hook",
		ids: map[string]struct{}{}, arrivals: map[string]time.Time{}}
	rc.srv = &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	go rc.srv.Serve(ln) //nolint:errcheck
	return rc, nil
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(r.Body)
	rc.requests.Add(1)
	rc.mu.Lock()
	if rc.trackIDs {
		rc.ids[r.Header.Get("webhook-id")] = struct{}{}
	}
	track := rc.trackArr
	rc.mu.Unlock()
	if track {
		var env struct {
			Data struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if json.Unmarshal(body, &env) == nil {
			rc.mu.Lock()
			if _, seen := rc.arrivals[env.Data.ID]; !seen || rc.latest {
				rc.arrivals[env.Data.ID] = at
			}
			rc.mu.Unlock()
		}
	}
	if rc.delay > 0 {
		time.Sleep(rc.delay)
	}
	w.WriteHeader(http.StatusNoContent)
}

// reset clears the counters and sets what is tracked.
func (rc *receiver) reset(trackIDs, trackArrivals bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.requests.Store(0)
	rc.ids = map[string]struct{}{}
	rc.arrivals = map[string]time.Time{}
	rc.trackIDs, rc.trackArr = trackIDs, trackArrivals
}

// duplicates is requests beyond the distinct webhook-ids seen.
func (rc *receiver) duplicates() (requests, distinct int64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.requests.Load(), int64(len(rc.ids))
}

func (rc *receiver) close() { _ = rc.srv.Close() }

// ---- statistics ----

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func msf(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

func rate(n float64) string {
	switch {
	case n >= 100:
		return fmt.Sprintf("%s", commas(int64(n+0.5)))
	default:
		return fmt.Sprintf("%.1f", n)
	}
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[0] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ---- machine facts ----

type machine struct {
	NProc    string
	Memory   string
	Postgres string
	Go       string
	Settings string
	Tree     string
}

func machineFacts(ctx context.Context) machine {
	m := machine{Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		m.Tree = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("nproc").Output(); err == nil {
		m.NProc = strings.TrimSpace(string(out))
	} else {
		m.NProc = strconv.Itoa(runtime.NumCPU())
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				f := strings.Fields(line)
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					m.Memory = fmt.Sprintf("%.1f GiB", kb/1024/1024)
				}
			}
		}
	}
	if conn, err := pgx.Connect(ctx, dbtest.ServerURL()); err == nil {
		defer conn.Close(ctx)
		_ = conn.QueryRow(ctx, "SELECT version()").Scan(&m.Postgres)
		var sb, sc, wal, mc string
		_ = conn.QueryRow(ctx, `SELECT current_setting('shared_buffers'), current_setting('synchronous_commit'),
			current_setting('wal_level'), current_setting('max_connections')`).Scan(&sb, &sc, &wal, &mc)
		m.Settings = fmt.Sprintf("shared_buffers=%s, synchronous_commit=%s, wal_level=%s, max_connections=%s", sb, sc, wal, mc)
	}
	return m
}

// pidCPU returns the CPU time (user+system) a process has used, 0 when unreadable.
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	closing := strings.LastIndexByte(s, ')')
	if closing < 0 {
		return 0
	}
	f := strings.Fields(s[closing+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// dbCPU follows the CPU time of the PostgreSQL backends connected to one
// database (the machine is shared: other databases' backends are not
// ours). It polls pg_stat_activity; a backend's last increment before it
// exits between two polls is missed, a small undercount.
type dbCPU struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	base map[int]time.Duration
	last map[int]time.Duration
}

func watchDBCPU(ctx context.Context, pool *pgxpool.Pool) *dbCPU {
	w := &dbCPU{stop: make(chan struct{}), done: make(chan struct{}), base: map[int]time.Duration{}, last: map[int]time.Duration{}}
	first := true
	poll := func() {
		rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
		if err != nil {
			return
		}
		pids, _ := pgx.CollectRows(rows, pgx.RowTo[int32])
		w.mu.Lock()
		for _, pid := range pids {
			c := pidCPU(int(pid))
			if first {
				w.base[int(pid)] = c
			}
			if c > 0 {
				w.last[int(pid)] = c
			}
		}
		w.mu.Unlock()
		first = false
	}
	poll()
	go func() {
		defer close(w.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				poll()
				return
			case <-t.C:
				poll()
			}
		}
	}()
	return w
}

// total stops the watch and returns the CPU used since it started.
func (w *dbCPU) total() time.Duration {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	var t time.Duration
	for pid, c := range w.last {
		t += c - w.base[pid]
	}
	return t
}

// pgCPU returns the CPU time (user+system) used so far by every postgres
// process on the machine, and by those that exited (the postmaster's
// reaped children), read from /proc; 0 when unreadable. It only grows,
// however many connections come and go between two readings.
func pgCPU() time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < 0 || !strings.HasPrefix(s[open+1:closing], "postgres") {
			continue
		}
		f := strings.Fields(s[closing+2:])
		if len(f) < 15 {
			continue
		}
		for _, i := range []int{11, 12, 13, 14} { // utime, stime, cutime, cstime
			n, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ = 100
}
