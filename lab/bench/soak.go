package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The soak runs the real api and worker (built with go build, as deployed)
// for an hour or more at a steady order rate, with retention shortened so
// that partitions are made, filled, settled and dropped many times within
// the run, and records over time what must stay flat: table and index
// sizes, dead tuples, claim and commit-to-delivery p99, WAL per order,
// autovacuum runs and the retention job's duration.
//
//	./task soak -- 1h      (go run ./lab/bench -soak 1h): writes lab/bench/SOAK.md and soak.svg

// soakEnv is the worker's settings besides the defaults: retention shortened
// from a week to minutes, so that many cycles happen within the run.
var soakEnv = []struct{ name, value string }{
	{"OUTBOX_RETENTION", "10m"},
	{"OUTBOX_PARTITION_SPAN", "5m"},
	{"OUTBOX_PRUNE_INTERVAL", "1m"},
	{"OUTBOX_PARTITIONS_AHEAD", "15m"},
}

// soakConfig is one soak: its length, the order rate (0: half of what the
// machine sustains, measured first), and the report's path (the plot is
// written beside it).
type soakConfig struct {
	Duration time.Duration
	Rate     int
	Out      string
	// Autovacuum turns the server's autovacuum on for the run when it is
	// off (as some CI servers run), and back off after: a soak without it
	// measures no server anyone runs in production.
	Autovacuum bool
}

// capacityWindow is how long the capacity is measured for, before the soak.
func (sc soakConfig) capacityWindow() time.Duration {
	return min(30*time.Second, max(3*time.Second, sc.Duration/20))
}

const soakToken = "soak-admin-token-0123456789abcdef0123456789"

// soakStep is what one sampling step saw.
type soakStep struct {
	at               time.Duration // end of the step, since the load began
	orders, dropped  int
	post, lag, claim []time.Duration

	outboxHeap, outboxIndex, riverJob, orderTables int64
	outboxDead, riverDead                          int64
	partitions                                     int
	wal                                            int64 // bytes written in the step
	autovacuums                                    int
	prunes                                         []time.Duration // prune jobs finished in the step
	partitionsDropped                              int64           // partitions dropped in the step
	pgCPU, workerCPU, apiCPU                       time.Duration
}

// soakRun is the soak's shared state: the latency pairing of commits and
// arrivals, and the step being filled.
type soakRun struct {
	mu       sync.Mutex
	commits  map[string]time.Time // order id → POST answered, awaiting its webhook
	arrivals map[string]time.Time // order id → webhook arrived, awaiting its POST's answer
	cur      soakStep
	failure  error // the first order or claim probe that failed
	requests atomic.Int64
}

func (s *soakRun) committed(id string, at, sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.orders++
	s.cur.post = append(s.cur.post, at.Sub(sent))
	if a, ok := s.arrivals[id]; ok {
		delete(s.arrivals, id)
		s.cur.lag = append(s.cur.lag, max(0, a.Sub(at)))
		return
	}
	s.commits[id] = at
}

func (s *soakRun) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	s.requests.Add(1)
	var env struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&env); err == nil {
		s.mu.Lock()
		if c, ok := s.commits[env.Data.ID]; ok {
			delete(s.commits, env.Data.ID)
			s.cur.lag = append(s.cur.lag, max(0, at.Sub(c)))
		} else {
			s.arrivals[env.Data.ID] = at
		}
		s.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}

// take ends the step being filled and starts the next.
func (s *soakRun) take() soakStep {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.cur
	s.cur = soakStep{}
	return st
}

// awaiting is the orders committed whose webhook has not arrived.
func (s *soakRun) awaiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.commits)
}

// soakProcess is the api or the worker, run from its binary.
type soakProcess struct {
	cmd    *exec.Cmd
	addr   string
	log    string
	exited chan struct{}
}

func startSoakProcess(bin, addrVar, logPath string, env []string) (*soakProcess, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_FORMAT=json",
		addrVar + "=" + addr}, env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	p := &soakProcess{cmd: cmd, addr: addr, log: logPath, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.exited) }()
	if err := until(context.Background(), 60*time.Second, filepath.Base(bin)+" ready", func() (bool, error) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		p.stop()
		return nil, fmt.Errorf("%w (log: %s)", err, logPath)
	}
	return p, nil
}

func (p *soakProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// warningLines is the log's lines at level WARN or ERROR, the first n: what
// explains a redelivery, or a latency spike.
func (p *soakProcess) warningLines(n int) []string {
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if (strings.Contains(sc.Text(), `"level":"ERROR"`) || strings.Contains(sc.Text(), `"level":"WARN"`)) && len(out) < n {
			out = append(out, sc.Text())
		}
	}
	return out
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// metric reads one counter or gauge without labels from a /metrics page.
func metric(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s not on %s/metrics", name, addr)
}

// placer POSTs orders to the api.
type placer struct {
	client *http.Client
	url    string
	body   []byte
}

func newPlacer(apiAddr string) *placer {
	return &placer{
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}},
		url:    "http://" + apiAddr + "/orders",
		body:   []byte(`{"customer_id":"c-soak","lines":[{"sku":"A-1","quantity":2,"unit_price_cents":500},{"sku":"B-2","quantity":1,"unit_price_cents":1250}]}`),
	}
}

// place POSTs one order and returns its id.
func (p *placer) place(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, strings.NewReader(string(p.body)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var o struct {
		ID string `json:"id"`
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("POST /orders: %d %s", resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &o); err != nil {
		return "", err
	}
	return o.ID, nil
}

// soakCapacity is what the machine sustains: orders placed by 32 clients
// as fast as they go for d (after a few seconds of warm-up), divided by the
// time from the first until every one of them was delivered, so a worker
// that falls behind the api lowers it.
func soakCapacity(ctx context.Context, p *placer, s *soakRun, d time.Duration) (float64, error) {
	var failed atomic.Pointer[error]
	measure := func(d time.Duration) (float64, error) {
		var n atomic.Int64
		start := time.Now()
		end := start.Add(d)
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				// No request is cut off at the end: each client sends none
				// after it, and waits for the answer to the one in flight.
				for time.Now().Before(end) {
					sent := time.Now()
					id, err := p.place(ctx)
					if err != nil {
						failed.CompareAndSwap(nil, &err)
						return
					}
					s.committed(id, time.Now(), sent)
					n.Add(1)
				}
			})
		}
		wg.Wait()
		if e := failed.Load(); e != nil {
			return 0, *e
		}
		if err := until(ctx, 5*time.Minute, "the capacity run's webhooks", func() (bool, error) { return s.awaiting() == 0, nil }); err != nil {
			return 0, err
		}
		return float64(n.Load()) / time.Since(start).Seconds(), nil
	}
	if _, err := measure(3 * time.Second); err != nil {
		return 0, err
	}
	return measure(d)
}

// soakProbe times the relay's claim statement as a deliver job sends it,
// for a destination of the soak's own with 100 due messages, all written
// and the claim taken in one transaction that is then rolled back: what a
// claim costs on the tables as the soak has left them (their partitions,
// indexes and dead tuples), while nothing of it stays.
func soakProbe(ctx context.Context, pool *pgxpool.Pool, probe uuid.UUID) (time.Duration, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	l := leased{destination: probe, token: uuid.New()}
	if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET lease_token = $2 WHERE id = $1`, probe, l.token); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `
		WITH src AS MATERIALIZED (
			SELECT g, t.at, outbox_uuid_v7_at(t.at) AS id
			FROM (SELECT g, now() - interval '1 second' + g * interval '1 microsecond' AS at FROM generate_series(1, 100) g) t
		), ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT id, 'order.cancelled', '{}'::json, at FROM src
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(id), id, 'order.cancelled', $1, at, at FROM src`, probe); err != nil {
		return 0, fmt.Errorf("writing the probe's messages: %w", err)
	}
	return timeClaim(ctx, tx, l)
}

// soakTables is the database's state at one sample.
type soakTables struct {
	outboxHeap, outboxIndex, riverJob, orderTables int64
	outboxDead, riverDead                          int64
	partitions                                     int
	wal                                            int64
	vacuums                                        map[uint32]int64
}

func readSoakTables(ctx context.Context, pool *pgxpool.Pool) (soakTables, error) {
	var t soakTables
	err := pool.QueryRow(ctx, `
		WITH o AS (
			SELECT p.relid FROM unnest(ARRAY['outbox_events', 'outbox_messages', 'outbox_attempts']::regclass[]) r,
			     pg_partition_tree(r) p WHERE p.isleaf
		)
		SELECT (SELECT coalesce(sum(pg_table_size(relid)), 0) FROM o)::bigint,
		       (SELECT coalesce(sum(pg_indexes_size(relid)), 0) FROM o)::bigint,
		       pg_total_relation_size('river_job'),
		       pg_total_relation_size('orders') + pg_total_relation_size('order_lines'),
		       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables s JOIN o USING (relid))::bigint,
		       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'river_job'::regclass),
		       (SELECT count(*) FROM outbox_partitions())::int,
		       (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&t.outboxHeap, &t.outboxIndex, &t.riverJob, &t.orderTables,
		&t.outboxDead, &t.riverDead, &t.partitions, &t.wal)
	if err != nil {
		return t, fmt.Errorf("reading the tables' sizes: %w", err)
	}
	rows, err := pool.Query(ctx, "SELECT relid::oid::int8, autovacuum_count FROM pg_stat_user_tables")
	if err != nil {
		return t, err
	}
	t.vacuums = map[uint32]int64{}
	for rows.Next() {
		var relid, n int64
		if err := rows.Scan(&relid, &n); err != nil {
			return t, err
		}
		t.vacuums[uint32(relid)] = n
	}
	return t, rows.Err()
}

// prunesSince is the durations of the prune jobs that finished after the
// job id last, and the newest id seen.
func prunesSince(ctx context.Context, pool *pgxpool.Pool, last int64) ([]time.Duration, int64, error) {
	rows, err := pool.Query(ctx, `SELECT id, extract(epoch FROM finalized_at - attempted_at)
		FROM river_job WHERE kind = 'outbox_prune' AND state = 'completed' AND id > $1 ORDER BY id`, last)
	if err != nil {
		return nil, last, err
	}
	var out []time.Duration
	for rows.Next() {
		var secs float64
		if err := rows.Scan(&last, &secs); err != nil {
			return nil, last, err
		}
		out = append(out, time.Duration(secs*float64(time.Second)))
	}
	return out, last, rows.Err()
}

func runSoak(ctx context.Context, sc soakConfig, log io.Writer) error {
	progress = log
	started := time.Now()
	machine := machineFacts(ctx)
	dir, err := os.MkdirTemp("", "outboxkit-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	logf("soak: building cmd/api and cmd/worker")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"github.com/outboxkit/orders/cmd/api", "github.com/outboxkit/orders/cmd/worker").CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	d, err := newMigratedDatabase(ctx)
	if err != nil {
		return err
	}
	defer d.drop() //nolint:errcheck
	pool, err := d.pool(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	autovacuum, restore, err := soakAutovacuum(ctx, pool, sc.Autovacuum)
	if err != nil {
		return err
	}
	defer restore()
	// Start with the partitions a worker with these settings keeps, not the
	// migration's days: every order of the run lands in a five-minute one.
	if err := soakPartitions(ctx, pool); err != nil {
		return err
	}

	s := &soakRun{commits: map[string]time.Time{}, arrivals: map[string]time.Time{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	recv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go recv.Serve(ln) //nolint:errcheck
	defer recv.Close()
	hook := "http://" + ln.Addr().String() + "/hook"

	common := []string{"DATABASE_URL=" + d.url, "OUTBOX_ALLOW_PRIVATE_TARGETS=true"}
	workerEnv := slices.Clone(common)
	for _, e := range soakEnv {
		workerEnv = append(workerEnv, e.name+"="+e.value)
	}
	worker, err := startSoakProcess(filepath.Join(dir, "worker"), "WORKER_ADDR", filepath.Join(dir, "worker.log"), workerEnv)
	if err != nil {
		return err
	}
	defer worker.stop()
	api, err := startSoakProcess(filepath.Join(dir, "api"), "API_ADDR", filepath.Join(dir, "api.log"),
		append(common, "ADMIN_TOKEN="+soakToken))
	if err != nil {
		return err
	}
	defer api.stop()
	if err := soakEndpoint(api.addr, hook); err != nil {
		return err
	}
	// The claim probe's destination: subscribed to an event the soak never
	// emits, so the worker never has anything of it to deliver.
	var probe uuid.UUID
	if err := pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ($1, 'whsec_c29hay1wcm9iZS1zZWNyZXQtMDEyMzQ1Njc4OWFi', ARRAY['order.cancelled']) RETURNING id`, hook).Scan(&probe); err != nil {
		return err
	}

	p := newPlacer(api.addr)
	rate := sc.Rate
	var capacity float64
	if rate == 0 {
		if capacity, err = soakCapacity(ctx, p, s, sc.capacityWindow()); err != nil {
			return fmt.Errorf("measuring capacity: %w", err)
		}
		rate = max(10, int(capacity/2/10+0.5)*10)
		logf("soak: the machine sustains %.0f orders/s, placed and delivered; the soak places %d/s", capacity, rate)
	}
	s.take()
	s.requests.Store(0) // the soak's own: a count beyond its orders is a duplicate

	m, err := newSoakSampler(ctx, pool, worker, api)
	if err != nil {
		return err
	}
	step := min(30*time.Second, max(2*time.Second, sc.Duration/60))
	loadCtx, stopLoad := context.WithTimeout(ctx, sc.Duration)
	defer stopLoad()
	loaded := make(chan struct{})
	go func() { s.load(ctx, loadCtx, p, rate); close(loaded) }()
	go s.probe(loadCtx, pool, probe)
	var steps []soakStep
	loadStart := time.Now()
	logf("soak: %d orders/s for %s, sampled every %s", rate, sc.Duration, step)
	tick := time.NewTicker(step)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		done = time.Since(loadStart) >= sc.Duration
		st := s.take()
		st.at = time.Since(loadStart)
		if err := m.sample(ctx, &st); err != nil {
			return err
		}
		steps = append(steps, st)
		logf("  %s: %d orders (%d dropped), lag p99 %s, claim p99 %s, outbox %s, dead %d, partitions %d, prunes %v",
			st.at.Round(time.Second), st.orders, st.dropped, ms(p99(st.lag)), ms(p99(st.claim)),
			mib(st.outboxHeap+st.outboxIndex), st.outboxDead, st.partitions, st.prunes)
	}
	<-loaded
	if err := s.failed(); err != nil {
		return err
	}
	// Every order's webhook, before anything is concluded.
	lost := 0
	if err := until(ctx, time.Minute, "every order's webhook", func() (bool, error) { return s.awaiting() == 0, nil }); err != nil {
		lost = s.awaiting()
	}
	if tail := s.take(); len(steps) > 0 {
		steps[len(steps)-1].lag = append(steps[len(steps)-1].lag, tail.lag...)
	}
	var retained int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_messages").Scan(&retained); err != nil {
		return err
	}
	res := soakResult{cfg: sc, autovacuum: autovacuum, rate: rate, capacity: capacity, steps: steps, lost: lost, retained: retained,
		requests: s.requests.Load(), workerWarnings: worker.warningLines(5), apiWarnings: api.warningLines(5)}
	return res.write(machine, started)
}

// load places orders at rate until loadCtx ends, on schedule whatever the
// latency of earlier ones (an open loop), with 64 placers; an order none of
// them is free to take within the queue's slack is counted as dropped.
func (s *soakRun) load(ctx, loadCtx context.Context, p *placer, rate int) {
	jobs := make(chan struct{}, 4096)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range jobs {
				sent := time.Now()
				id, err := p.place(ctx)
				if err != nil {
					s.mu.Lock()
					s.failure = cmp.Or(s.failure, err)
					s.mu.Unlock()
					continue
				}
				s.committed(id, time.Now(), sent)
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; ; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-loadCtx.Done():
				return
			case <-time.After(wait):
			}
		}
		if loadCtx.Err() != nil {
			return
		}
		select {
		case jobs <- struct{}{}:
		default:
			s.mu.Lock()
			s.cur.dropped++
			s.mu.Unlock()
		}
	}
}

// probe times the claim (soakProbe) every second until loadCtx ends.
func (s *soakRun) probe(loadCtx context.Context, pool *pgxpool.Pool, probe uuid.UUID) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-loadCtx.Done():
			return
		case <-t.C:
		}
		took, err := soakProbe(loadCtx, pool, probe)
		s.mu.Lock()
		if err == nil {
			s.cur.claim = append(s.cur.claim, took)
		} else if loadCtx.Err() == nil {
			s.failure = cmp.Or(s.failure, fmt.Errorf("claim probe: %w", err))
		}
		s.mu.Unlock()
	}
}

// failed is the first order or claim probe that failed: either ends the soak.
func (s *soakRun) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// soakSampler reads, at the end of each step, what the database and the
// processes did in it: sizes and dead tuples as they are, and the
// differences since the last reading of the rest.
type soakSampler struct {
	pool        *pgxpool.Pool
	worker, api *soakProcess
	prev        soakTables
	lastPrune   int64
	dropped     float64
	pg, w, a    time.Duration
}

func newSoakSampler(ctx context.Context, pool *pgxpool.Pool, worker, api *soakProcess) (*soakSampler, error) {
	m := &soakSampler{pool: pool, worker: worker, api: api}
	var err error
	if m.prev, err = readSoakTables(ctx, pool); err != nil {
		return nil, err
	}
	if _, m.lastPrune, err = prunesSince(ctx, pool, 0); err != nil {
		return nil, err
	}
	m.dropped, _ = metric(worker.addr, "outbox_partitions_dropped_total")
	m.pg, m.w, m.a = pgCPU(), pidCPU(worker.cmd.Process.Pid), pidCPU(api.cmd.Process.Pid)
	return m, nil
}

func (m *soakSampler) sample(ctx context.Context, st *soakStep) error {
	t, err := readSoakTables(ctx, m.pool)
	if err != nil {
		return err
	}
	st.outboxHeap, st.outboxIndex, st.riverJob, st.orderTables = t.outboxHeap, t.outboxIndex, t.riverJob, t.orderTables
	st.outboxDead, st.riverDead, st.partitions, st.wal = t.outboxDead, t.riverDead, t.partitions, t.wal-m.prev.wal
	for relid, n := range t.vacuums {
		st.autovacuums += int(max(0, n-m.prev.vacuums[relid]))
	}
	m.prev = t
	if st.prunes, m.lastPrune, err = prunesSince(ctx, m.pool, m.lastPrune); err != nil {
		return err
	}
	if v, err := metric(m.worker.addr, "outbox_partitions_dropped_total"); err == nil {
		st.partitionsDropped, m.dropped = int64(v-m.dropped), v
	}
	pg, w, a := pgCPU(), pidCPU(m.worker.cmd.Process.Pid), pidCPU(m.api.cmd.Process.Pid)
	st.pgCPU, st.workerCPU, st.apiCPU = pg-m.pg, w-m.w, a-m.a
	m.pg, m.w, m.a = pg, w, a
	return nil
}

// soakAutovacuum reports how the server's autovacuum runs for the soak.
// When it is off and on is set, it turns it on (ALTER SYSTEM, reloaded)
// until restore, which sets it back as it was.
func soakAutovacuum(ctx context.Context, pool *pgxpool.Pool, on bool) (string, func(), error) {
	var setting string
	if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&setting); err != nil {
		return "", nil, err
	}
	if setting == "on" || !on {
		return setting, func() {}, nil
	}
	var auto string // what postgresql.auto.conf says now, if anything
	_ = pool.QueryRow(ctx, `SELECT setting FROM pg_file_settings WHERE name = 'autovacuum'
		AND sourcefile LIKE '%postgresql.auto.conf' AND applied`).Scan(&auto)
	if _, err := pool.Exec(ctx, "ALTER SYSTEM SET autovacuum = on"); err != nil {
		return "", nil, fmt.Errorf("turning autovacuum on for the soak: %w", err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return "", nil, err
	}
	logf("soak: the server's autovacuum was off; on for the soak, off again after")
	restore := func() {
		ctx := context.Background()
		stmt := "ALTER SYSTEM RESET autovacuum"
		if auto == "on" || auto == "off" {
			stmt = "ALTER SYSTEM SET autovacuum = " + auto
		}
		if _, err := pool.Exec(ctx, stmt); err == nil {
			_, _ = pool.Exec(ctx, "SELECT pg_reload_conf()")
		}
	}
	return "off on the server, turned on for the soak (`ALTER SYSTEM`) and off again after", restore, nil
}

// soakPartitions replaces the migration's daily partitions (all empty) with
// the five-minute ones the worker keeps with soakEnv, so the run starts as
// it goes on.
func soakPartitions(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		DO $$
		DECLARE p record;
		BEGIN
			DROP TABLE outbox_attempts_legacy, outbox_messages_legacy, outbox_events_legacy;
			FOR p IN SELECT suffix FROM outbox_partitions() LOOP
				EXECUTE format('DROP TABLE %I, %I, %I', 'outbox_attempts_' || p.suffix,
				               'outbox_messages_' || p.suffix, 'outbox_events_' || p.suffix);
			END LOOP;
			PERFORM outbox_partition_create(b, b + interval '5 minutes')
			FROM date_bin(interval '5 minutes', now(), timestamptz '1970-01-01 00:00:00+00') b;
			PERFORM outbox_partitions_extend(now() + interval '15 minutes', interval '5 minutes');
		END $$`)
	if err != nil {
		return fmt.Errorf("making five-minute partitions: %w", err)
	}
	return nil
}

// soakEndpoint subscribes the receiver to order.placed through the api.
func soakEndpoint(apiAddr, hook string) error {
	req, err := http.NewRequest(http.MethodPost, "http://"+apiAddr+"/webhook-endpoints",
		strings.NewReader(`{"url":"`+hook+`","event_types":["order.placed"]}`))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+soakToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /webhook-endpoints: %d %s", resp.StatusCode, b)
	}
	return nil
}

func p99(xs []time.Duration) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentile(s, .99)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
