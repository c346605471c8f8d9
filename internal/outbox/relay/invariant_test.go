package relay_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// The relay's invariants, under a randomized schedule of everything that
// can go wrong around it. A seeded generator drives several endpoints whose
// receivers change behaviour (answering at once, slowly, hanging, resetting
// the connection, 410, 429 and 503 with and without Retry-After, a small
// worker pool that refuses the excess, 500, 422), three relays that are
// killed and replaced (cancelled in process without any cleanup: their
// database connections cut, their requests cut off), delays on a relay's
// database connection, replays, pauses, deletions, skips and retries by a
// person, and row locks held on endpoints. Every request the relays make is
// recorded where it is made; afterwards, with every receiver answering
// again, everything must drain, and the history must show:
//
//   - no committed event lost: every message ends delivered, or discarded
//     by a person's skip or its endpoint's deletion, and every live
//     endpoint's receiver got every event written after it was created;
//   - per endpoint and key, no request while an earlier message of the key,
//     one that existed for a second before it, was unfinished (commit
//     order, replays included);
//   - never two requests of one endpoint and key in flight at once, and
//     never more than OUTBOX_DESTINATION_CONCURRENCY of one endpoint;
//   - no message parked with nothing ahead of it (sampled throughout; the
//     bound is zero: a promotion commits with what lets its key go on);
//   - no attempt started while its destination was backing off;
//   - the relays' delivery counters never above the table's attempts, and
//     equal when no relay was killed (a killed relay's last write may
//     commit with its answer lost, recorded and never counted).
//
// Every setting is the default but the retry schedule, shortened to
// seconds (with a cap of four attempts) so that messages fail, and people
// skip and retry them, within the run.
//
// CI runs two seeds of 40 s each (OUTBOX_INVARIANT_SEEDS,
// OUTBOX_INVARIANT_FOR); `./task invariants -- 30m` runs longer. A failure
// prints the command that replays its seed's schedule (the database and
// the network are real, so the same seed is the same schedule, not the
// same interleaving).
func TestRelayInvariants(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the randomized invariant run takes a minute or more")
	}
	runFor := 40 * time.Second
	if v := os.Getenv("OUTBOX_INVARIANT_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "OUTBOX_INVARIANT_FOR")
		runFor = d
	}
	var seeds []uint64
	if v := os.Getenv("OUTBOX_INVARIANT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "OUTBOX_INVARIANT_SEED")
		seeds = []uint64{s}
	} else {
		n := 2
		if v := os.Getenv("OUTBOX_INVARIANT_SEEDS"); v != "" {
			var err error
			n, err = strconv.Atoi(v)
			require.NoError(t, err, "OUTBOX_INVARIANT_SEEDS")
		}
		for range n {
			seeds = append(seeds, rand.Uint64())
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, seed)
			defer func() {
				if t.Failed() {
					t.Logf("replay this schedule: OUTBOX_INVARIANT_SEED=%d OUTBOX_INVARIANT_FOR=%s go test -count=1 -run 'TestRelayInvariants' ./internal/outbox/relay/",
						seed, runFor)
					t.Logf("actions:\n%s", strings.Join(w.actions(), "\n"))
				}
			}()
			w.run(runFor)
			w.drain()
			w.check()
		})
	}
}

// invariantConfig is the relays' configuration: the defaults, with a retry
// schedule of seconds and four attempts.
func invariantConfig() relay.Config {
	return relay.Config{
		RetrySchedule: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second},
		MaxAttempts:   4,
	}
}

// keys are the ordering keys events are written with (a fifth are
// unkeyed).
var keys = []string{"order-a", "order-b", "order-c", "order-d", "order-e", "order-f"}

// world is one seed's run: the database, the relays, the endpoints and
// everything that happened.
type world struct {
	t      *testing.T
	seed   uint64
	rng    *rand.Rand
	url    string
	pgAddr string
	pool   *pgxpool.Pool
	adm    *admin.Service
	ctx    context.Context
	cfg    relay.Config

	mu        sync.Mutex
	endpoints []*endpoint
	relays    []*relayProc
	events    []event
	log       []string
	requests  []request
	inFlight  map[uuid.UUID]int // by endpoint, the relays' requests in flight
	peak      map[uuid.UUID]int
	keyFlight map[[2]string]int // by endpoint and key
	overlaps  []string
	enables   map[uuid.UUID][]time.Time
	skipped   map[uuid.UUID]bool // messages a person skipped
	stranded  []string
	states    []stateSample
	replays   []replayed
	kills     int
	locks     sync.WaitGroup
	started   time.Time
}

type event struct {
	id        uuid.UUID
	key       string
	committed time.Time
}

// replayCopy says whether a message was written by a replay: its id (a
// UUIDv7) has its event's time, and a copy is written later, where a
// message written with its event has that time as created_at.
func replayCopy(id uuid.UUID, created time.Time) bool {
	sec, nsec := id.Time().UnixTime()
	return created.Sub(time.Unix(sec, nsec)) > 50*time.Millisecond
}

// replayed is one replay of an endpoint: when it ran, and the endpoint's
// messages claimed while it ran. A replayed copy waits for a message of
// its key claimed before it (docs/design.md: a replayed event is never
// sent while a message of its key is in flight), so one of those may go
// out before the earlier events the replay writes behind it.
type replayed struct {
	endpoint   uuid.UUID
	start, end time.Time
	claimed    map[uuid.UUID]bool
}

// request is one Deliver call a relay made, as the relay made it.
type request struct {
	relay      int
	message    uuid.UUID
	event      uuid.UUID
	endpoint   uuid.UUID
	key        string
	start, end time.Time
	delivered  bool
	// killed: its relay was killed before it started; it never left.
	killed bool
}

type stateSample struct {
	endpoint     uuid.UUID
	at           time.Time
	health       string
	backoffUntil *time.Time
}

func newWorld(t *testing.T, seed uint64) *world {
	url := dbtest.URL(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	db.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	w := &world{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), url: url,
		pgAddr: net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))),
		pool:   pool, adm: admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler)),
		ctx: context.Background(), cfg: invariantConfig(),
		inFlight: map[uuid.UUID]int{}, peak: map[uuid.UUID]int{}, keyFlight: map[[2]string]int{},
		enables: map[uuid.UUID][]time.Time{}, skipped: map[uuid.UUID]bool{}, started: time.Now(),
	}
	for range 4 {
		w.addEndpoint()
	}
	t.Cleanup(w.stopAll)
	for range 3 {
		w.startRelay()
	}
	return w
}

func (w *world) say(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%7.3fs ", time.Since(w.started).Seconds())+fmt.Sprintf(format, args...))
}

func (w *world) actions() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.log)
}

// run drives the random schedule for d.
func (w *world) run(d time.Duration) {
	stop := make(chan struct{})
	var samplers sync.WaitGroup
	samplers.Go(func() { w.sample(stop) })
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		w.act()
	}
	close(stop)
	samplers.Wait()
}

// act takes one random step of the schedule.
func (w *world) act() {
	switch r := w.rng.IntN(100); {
	case r < 45:
		for range 1 + w.rng.IntN(4) {
			w.enqueue()
		}
	case r < 60:
		w.behave(w.pick(), w.randomBehaviour())
	case r < 63:
		w.kill()
	case r < 67:
		w.replay()
	case r < 71:
		w.toggle()
	case r < 72:
		w.deleteAndReplace()
	case r < 78:
		w.skipOrRetry()
	case r < 82:
		w.lockEndpoint()
	case r < 86:
		w.delay()
	}
}

// sample checks, every 300 ms, that no parked message stands with nothing
// ahead of it, and keeps the endpoints' states.
func (w *world) sample(stop chan struct{}) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		w.sampleOnce()
	}
}

func (w *world) sampleOnce() {
	// A parked message is blocked while any message of its destination and
	// key is in flight, or any before it is unfinished: the rule stated in
	// full here, without the index's view.
	rows, err := w.pool.Query(w.ctx, `SELECT p.id, p.destination, p.ordering_key FROM outbox_messages p
		WHERE p.status = 'pending' AND p.parked
		  AND NOT EXISTS (SELECT 1 FROM outbox_messages b
		                  WHERE b.destination = p.destination AND b.ordering_key = p.ordering_key AND b.id <> p.id
		                    AND (b.status = 'claimed' OR (b.status IN ('pending', 'failed') AND b.id < p.id)))`)
	if err == nil {
		for rows.Next() {
			var id, dest uuid.UUID
			var key string
			if rows.Scan(&id, &dest, &key) == nil {
				w.mu.Lock()
				w.stranded = append(w.stranded, fmt.Sprintf("%s (destination %s, key %s) at %s", id, dest, key, time.Since(w.started)))
				w.mu.Unlock()
			}
		}
		rows.Close()
	}
	rows, err = w.pool.Query(w.ctx, `SELECT id, now(), health, backoff_until FROM webhook_endpoints`)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var s stateSample
		if rows.Scan(&s.endpoint, &s.at, &s.health, &s.backoffUntil) == nil {
			w.mu.Lock()
			w.states = append(w.states, s)
			w.mu.Unlock()
		}
	}
}

// Endpoints and their receivers.

type behaviour struct {
	name       string
	delay      time.Duration
	status     int
	retryAfter int
	workers    int64
}

func (w *world) randomBehaviour() behaviour {
	switch r := w.rng.IntN(100); {
	case r < 40:
		return behaviour{name: "ok", status: http.StatusNoContent}
	case r < 48:
		return behaviour{name: "slow", status: http.StatusNoContent, delay: time.Duration(50+w.rng.IntN(900)) * time.Millisecond}
	case r < 52:
		return behaviour{name: "hang"}
	case r < 57:
		return behaviour{name: "reset"}
	case r < 60:
		return behaviour{name: "gone", status: http.StatusGone}
	case r < 67:
		return behaviour{name: "full", status: http.StatusServiceUnavailable}
	case r < 71:
		return behaviour{name: "throttle", status: http.StatusTooManyRequests, retryAfter: 1 + w.rng.IntN(2)}
	case r < 85:
		return behaviour{name: "pool", status: http.StatusNoContent, workers: int64(1 + w.rng.IntN(4)),
			delay: time.Duration(2+w.rng.IntN(20)) * time.Millisecond}
	case r < 93:
		return behaviour{name: "error", status: http.StatusInternalServerError}
	default:
		return behaviour{name: "refuse", status: http.StatusUnprocessableEntity}
	}
}

type endpoint struct {
	id      uuid.UUID
	created time.Time
	deleted bool
	enabled bool
	srv     *httptest.Server

	mu       sync.Mutex
	behave   behaviour
	busy     atomic.Int64
	received map[uuid.UUID]int // event id → 2xx answers
}

func (e *endpoint) serve(rw http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	b := e.behave
	e.mu.Unlock()
	switch b.name {
	case "hang":
		<-r.Context().Done()
		return
	case "reset":
		if conn, _, err := http.NewResponseController(rw).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	case "pool":
		if e.busy.Add(1) > b.workers {
			e.busy.Add(-1)
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		defer e.busy.Add(-1)
	case "throttle":
		rw.Header().Set("Retry-After", strconv.Itoa(b.retryAfter))
	}
	if b.delay > 0 {
		select {
		case <-time.After(b.delay):
		case <-r.Context().Done():
			return
		}
	}
	if b.status >= 200 && b.status < 300 {
		var env struct{ ID uuid.UUID }
		if json.Unmarshal(body, &env) == nil {
			e.mu.Lock()
			e.received[env.ID]++
			e.mu.Unlock()
		}
	}
	rw.WriteHeader(b.status)
}

func (w *world) addEndpoint() *endpoint {
	e := &endpoint{received: map[uuid.UUID]int{}, behave: behaviour{name: "ok", status: http.StatusNoContent}, enabled: true}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	w.t.Cleanup(e.srv.Close)
	ep, err := w.adm.CreateEndpoint(w.ctx, e.srv.URL+"/hook", []string{"t"})
	require.NoError(w.t, err)
	e.id, e.created = ep.ID, time.Now()
	w.mu.Lock()
	w.endpoints = append(w.endpoints, e)
	w.mu.Unlock()
	w.say("endpoint %s created", e.id)
	return e
}

// pick is a random endpoint that is not deleted.
func (w *world) pick() *endpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []*endpoint
	for _, e := range w.endpoints {
		if !e.deleted {
			live = append(live, e)
		}
	}
	return live[w.rng.IntN(len(live))]
}

func (w *world) behave(e *endpoint, b behaviour) {
	e.mu.Lock()
	e.behave = b
	e.mu.Unlock()
	w.say("endpoint %s: %s", e.id, b.name)
}

// Relays, their database connections, and their requests.

type relayProc struct {
	n       int
	r       *relay.Relay
	proxy   *proxy
	kill    context.CancelFunc
	metrics *relay.Metrics
	reg     *prometheus.Registry
	pool    *pgxpool.Pool
	dead    bool
}

// stopAll stops every relay at once as the test ends. A killed relay
// cannot reach the database: its stop writes nothing, and is cut short.
func (w *world) stopAll() {
	w.mu.Lock()
	relays := slices.Clone(w.relays)
	w.mu.Unlock()
	var stops sync.WaitGroup
	for _, rp := range relays {
		stops.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = rp.r.Stop(ctx)
			rp.kill()
			// Close waits for every connection to come back; a killed
			// relay's goroutines may hold one a while: not waited for.
			go rp.pool.Close()
		})
	}
	stops.Wait()
}

func (w *world) startRelay() {
	w.mu.Lock()
	n := len(w.relays)
	w.mu.Unlock()
	px := newProxy(w.t, w.pgAddr)
	cfg, err := pgxpool.ParseConfig(w.url)
	require.NoError(w.t, err)
	db.ConfigurePool(cfg)
	cfg.MaxConns = 20 // as cmd/worker
	host, port, err := net.SplitHostPort(px.addr())
	require.NoError(w.t, err)
	p, err := strconv.Atoi(port)
	require.NoError(w.t, err)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	pool, err := pgxpool.NewWithConfig(w.ctx, cfg)
	require.NoError(w.t, err)
	killCtx, kill := context.WithCancel(w.ctx)
	metrics := relay.NewMetrics()
	reg := prometheus.NewRegistry()
	require.NoError(w.t, metrics.Register(reg))
	tr := &recordingTransport{w: w, relay: n, killed: killCtx,
		inner: &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}}
	r, err := relay.New(pool, w.cfg, tr, slog.New(slog.DiscardHandler), metrics)
	require.NoError(w.t, err)
	require.NoError(w.t, r.Start(w.ctx))
	rp := &relayProc{n: n, r: r, proxy: px, kill: kill, metrics: metrics, reg: reg, pool: pool}
	w.mu.Lock()
	w.relays = append(w.relays, rp)
	w.mu.Unlock()
	w.say("relay %d started", n)
}

// kill cuts a relay off as a SIGKILL would: its database connections
// close, its requests are cut off, and it runs no cleanup. Another relay
// takes its place.
func (w *world) kill() {
	w.mu.Lock()
	var live []*relayProc
	for _, rp := range w.relays {
		if !rp.dead {
			live = append(live, rp)
		}
	}
	if len(live) < 2 {
		w.mu.Unlock()
		return
	}
	rp := live[w.rng.IntN(len(live))]
	rp.dead = true
	w.kills++
	w.mu.Unlock()
	rp.proxy.cut()
	rp.kill()
	w.say("relay %d killed", rp.n)
	w.startRelay()
}

// delay slows one live relay's database connection for a while.
func (w *world) delay() {
	w.mu.Lock()
	rp := w.relays[w.rng.IntN(len(w.relays))]
	w.mu.Unlock()
	d := time.Duration(50+w.rng.IntN(1500)) * time.Millisecond
	for_ := time.Duration(1+w.rng.IntN(4)) * time.Second
	rp.proxy.setDelay(d)
	w.say("relay %d: database delayed %s for %s", rp.n, d, for_)
	time.AfterFunc(for_, func() { rp.proxy.setDelay(0) })
}

// recordingTransport records every request a relay makes, where it makes
// it, and cuts them off when the relay is killed.
type recordingTransport struct {
	w      *world
	relay  int
	killed context.Context
	inner  relay.Transport
}

func (tr *recordingTransport) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	w := tr.w
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(tr.killed, cancel)()
	dest := endpointOf(d.URL, w)
	req := request{relay: tr.relay, message: d.MessageID, event: d.EventID, endpoint: dest, key: d.OrderingKey, start: time.Now(),
		killed: tr.killed.Err() != nil}
	w.mu.Lock()
	w.inFlight[dest]++
	w.peak[dest] = max(w.peak[dest], w.inFlight[dest])
	if d.OrderingKey != "" {
		k := [2]string{dest.String(), d.OrderingKey}
		w.keyFlight[k]++
		if w.keyFlight[k] > 1 {
			w.overlaps = append(w.overlaps, fmt.Sprintf("%s: endpoint %s key %s: %d requests in flight (relay %d, message %s)",
				time.Since(w.started), dest, d.OrderingKey, w.keyFlight[k], tr.relay, d.MessageID))
		}
	}
	w.mu.Unlock()
	res := tr.inner.Deliver(ctx, d)
	req.end = time.Now()
	req.delivered = res.Err == nil && res.StatusCode >= 200 && res.StatusCode < 300
	w.mu.Lock()
	w.inFlight[dest]--
	if d.OrderingKey != "" {
		w.keyFlight[[2]string{dest.String(), d.OrderingKey}]--
	}
	w.requests = append(w.requests, req)
	w.mu.Unlock()
	return res
}

func endpointOf(url string, w *world) uuid.UUID {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.endpoints {
		if strings.HasPrefix(url, e.srv.URL+"/") {
			return e.id
		}
	}
	return uuid.Nil
}

// The schedule's other steps.

func (w *world) enqueue() {
	key := ""
	if w.rng.IntN(5) > 0 {
		key = keys[w.rng.IntN(len(keys))]
	}
	var id uuid.UUID
	err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) (err error) {
		id, err = outbox.Enqueue(w.ctx, tx, outbox.Event{Type: "t", Data: map[string]string{"k": key}, OrderingKey: key})
		return err
	})
	require.NoError(w.t, err)
	w.mu.Lock()
	w.events = append(w.events, event{id: id, key: key, committed: time.Now()})
	w.mu.Unlock()
}

func (w *world) replay() {
	e := w.pick()
	from := w.started.Add(time.Duration(w.rng.Int64N(int64(time.Since(w.started)) + 1)))
	r := admin.Replay{From: from, To: time.Now()}
	total := 0
	rp := replayed{endpoint: e.id, start: time.Now(), claimed: map[uuid.UUID]bool{}}
	// What is claimed as each batch commits (a replay is many batches).
	claimed := func() {
		rows, err := w.pool.Query(w.ctx, `SELECT id FROM outbox_messages WHERE destination = $1 AND status = 'claimed'`, e.id)
		require.NoError(w.t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		require.NoError(w.t, err)
		for _, id := range ids {
			rp.claimed[id] = true
		}
	}
	claimed()
	for {
		res, err := w.adm.ReplayEvents(w.ctx, e.id, r)
		if errors.Is(err, admin.ErrNotFound) {
			return
		}
		require.NoError(w.t, err)
		claimed()
		total += res.Replayed
		if res.Next == nil {
			break
		}
		r.After = res.Next
	}
	rp.end = time.Now()
	w.mu.Lock()
	w.replays = append(w.replays, rp)
	w.mu.Unlock()
	w.say("endpoint %s: replayed %d events from %s", e.id, total, from.Sub(w.started))
}

func (w *world) toggle() {
	e := w.pick()
	e.mu.Lock()
	enable := !e.enabled
	e.enabled = enable
	e.mu.Unlock()
	if _, err := w.adm.SetEndpointEnabled(w.ctx, e.id, enable); err != nil {
		require.ErrorIs(w.t, err, admin.ErrNotFound)
		return
	}
	if enable {
		w.mu.Lock()
		w.enables[e.id] = append(w.enables[e.id], time.Now())
		w.mu.Unlock()
	}
	w.say("endpoint %s: enabled %t", e.id, enable)
}

func (w *world) deleteAndReplace() {
	e := w.pick()
	w.mu.Lock()
	e.deleted = true
	w.mu.Unlock()
	n, err := w.adm.DeleteEndpoint(w.ctx, e.id)
	require.NoError(w.t, err)
	w.say("endpoint %s deleted (%d discarded)", e.id, n)
	w.addEndpoint()
}

func (w *world) skipOrRetry() {
	var ids []uuid.UUID
	rows, err := w.pool.Query(w.ctx, `SELECT id FROM outbox_messages WHERE status = 'failed' ORDER BY id LIMIT 20`)
	require.NoError(w.t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(w.t, err)
	if len(ids) == 0 {
		return
	}
	id := ids[w.rng.IntN(len(ids))]
	if w.rng.IntN(2) == 0 {
		if _, err := w.adm.Skip(w.ctx, id); err == nil {
			w.mu.Lock()
			w.skipped[id] = true
			w.mu.Unlock()
			w.say("message %s skipped", id)
		}
		return
	}
	if _, err := w.adm.Retry(w.ctx, id); err == nil {
		w.say("message %s retried", id)
	}
}

// lockEndpoint holds a row lock on an endpoint, as an operator's open
// transaction would, for a while.
func (w *world) lockEndpoint() {
	e := w.pick()
	hold := time.Duration(300+w.rng.IntN(2700)) * time.Millisecond
	w.say("endpoint %s: row locked for %s", e.id, hold)
	w.locks.Go(func() {
		_ = pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(w.ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE`, e.id); err != nil {
				return err
			}
			time.Sleep(hold)
			return nil
		})
	})
}

// drain lets everything settle: every receiver answers, no lock is held,
// no connection is slow, every endpoint is enabled (which probes one
// backing off at once) and what failed is retried, until nothing waits.
func (w *world) drain() {
	w.say("draining")
	w.locks.Wait()
	w.mu.Lock()
	eps := slices.Clone(w.endpoints)
	relays := slices.Clone(w.relays)
	w.mu.Unlock()
	for _, rp := range relays {
		rp.proxy.setDelay(0)
	}
	for _, e := range eps {
		if e.deleted {
			continue
		}
		w.behave(e, behaviour{name: "ok", status: http.StatusNoContent})
		_, err := w.adm.SetEndpointEnabled(w.ctx, e.id, true)
		require.NoError(w.t, err)
		w.mu.Lock()
		w.enables[e.id] = append(w.enables[e.id], time.Now())
		w.mu.Unlock()
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		for _, e := range eps {
			if !e.deleted {
				_, err := w.adm.RetryFailedForEndpoint(w.ctx, e.id)
				require.NoError(w.t, err)
			}
		}
		var waiting int
		require.NoError(w.t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM outbox_messages m
			JOIN webhook_endpoints e ON e.id = m.destination WHERE m.status IN ('pending', 'claimed', 'failed')`).Scan(&waiting))
		if waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			w.t.Errorf("%d messages of live endpoints still wait 90 s after the chaos ended", waiting)
			break
		}
		time.Sleep(time.Second)
	}
	w.sampleOnce()
	for _, rp := range relays {
		if !rp.dead {
			ctx, cancel := context.WithTimeout(w.ctx, 15*time.Second)
			require.NoError(w.t, rp.r.Stop(ctx), "a live relay stops gracefully")
			cancel()
		}
	}
}

// check holds the history against the invariants.
func (w *world) check() {
	t := w.t
	type message struct {
		id, event, dest      uuid.UUID
		key                  string
		status               string
		created              time.Time
		delivered, discarded *time.Time
		lastError            string
	}
	rows, err := w.pool.Query(w.ctx, `SELECT id, event_id, destination, coalesce(ordering_key, ''), status, created_at,
		delivered_at, discarded_at, coalesce(last_error, '') FROM outbox_messages ORDER BY id`)
	require.NoError(t, err)
	var msgs []message
	for rows.Next() {
		var m message
		require.NoError(t, rows.Scan(&m.id, &m.event, &m.dest, &m.key, &m.status, &m.created, &m.delivered, &m.discarded, &m.lastError))
		msgs = append(msgs, m)
	}
	require.NoError(t, rows.Err())
	w.mu.Lock()
	defer w.mu.Unlock()
	live := map[uuid.UUID]*endpoint{}
	for _, e := range w.endpoints {
		if !e.deleted {
			live[e.id] = e
		}
	}
	t.Logf("seed %d: %d events, %d messages, %d requests, %d relays killed, %d actions",
		w.seed, len(w.events), len(msgs), len(w.requests), w.kills, len(w.log))

	// No committed event lost.
	for _, m := range msgs {
		switch {
		case m.status == outbox.StatusDelivered:
		case m.status == outbox.StatusDiscarded && (w.skipped[m.id] || live[m.dest] == nil):
		case m.status == outbox.StatusPending && live[m.dest] == nil:
			// A deleted endpoint's message its job released after the
			// deletion: the orphan job discards it.
		default:
			t.Errorf("message %s (endpoint %s) ends %s: %s", m.id, m.dest, m.status, m.lastError)
		}
	}
	skippedEvents := map[[2]uuid.UUID]bool{}
	for _, m := range msgs {
		if w.skipped[m.id] {
			skippedEvents[[2]uuid.UUID{m.event, m.dest}] = true
		}
	}
	lost := 0
	for _, e := range live {
		for _, ev := range w.events {
			if ev.committed.After(e.created) && e.received[ev.id] == 0 && !skippedEvents[[2]uuid.UUID{ev.id, e.id}] {
				lost++
				if lost <= 10 {
					t.Errorf("event %s (key %q) never reached endpoint %s", ev.id, ev.key, e.id)
				}
			}
		}
	}

	// Per endpoint and key: no request while an earlier message of the key,
	// written a second before it, was unfinished.
	byKey := map[[2]string][]message{}
	for _, m := range msgs {
		if m.key != "" {
			k := [2]string{m.dest.String(), m.key}
			byKey[k] = append(byKey[k], m)
		}
	}
	settled := func(m message) *time.Time { return cmp.Or(m.delivered, m.discarded) }
	disorder := 0
	for _, r := range w.requests {
		// A request its relay made after it was killed never left.
		if r.key == "" || r.killed {
			continue
		}
		for _, m := range byKey[[2]string{r.endpoint.String(), r.key}] {
			if m.id.String() >= r.message.String() {
				break
			}
			if m.created.After(r.start.Add(-time.Second)) {
				continue
			}
			// A replay's copy written while r's message was claimed waits
			// for it (failed so before this was told apart: seed
			// 9480393867068269924, a message claimed before a replay of
			// earlier events of its key, its endpoint hanging).
			if replayCopy(m.id, m.created) && slices.ContainsFunc(w.replays, func(rp replayed) bool {
				return rp.endpoint == r.endpoint && rp.claimed[r.message] &&
					!m.created.Before(rp.start) && !m.created.After(rp.end)
			}) {
				continue
			}
			if s := settled(m); s == nil || s.After(r.start) {
				disorder++
				if disorder <= 10 {
					t.Errorf("relay %d sent message %s (endpoint %s, key %s) at %s while the earlier %s was unfinished (settled %v)",
						r.relay, r.message, r.endpoint, r.key, r.start.Sub(w.started), m.id, s)
				}
			}
		}
	}

	// Never two requests of one endpoint and key at once, never more than
	// the destination's concurrency.
	for i, o := range w.overlaps {
		if i < 10 {
			t.Errorf("two requests of one endpoint and key in flight at once: %s", o)
		}
	}
	for dest, n := range w.peak {
		require.LessOrEqual(t, n, relay.DefaultConfig().DestinationConcurrency, "endpoint %s: requests in flight at once", dest)
	}

	// No message parked with nothing ahead of it.
	for i, s := range w.stranded {
		if i < 10 {
			t.Errorf("parked with nothing ahead of it: %s", s)
		}
	}

	// No attempt started while its destination backed off.
	w.checkBackoff(t)

	// The counters agree with the table.
	w.checkMetrics(t)
}

// checkBackoff finds requests that started while a sample taken before
// them showed their destination backing off until after them, with no
// person's enable (which probes at once) in between. A request's start is
// read on this process's clock, as the samples' (the database's now(), on
// the same machine): the attempt's recorded started_at is the relay's
// estimate of the database's clock, off by up to half a delay the proxy
// put on one way of a heartbeat's round trip.
func (w *world) checkBackoff(t *testing.T) {
	byDest := map[uuid.UUID][]stateSample{}
	for _, s := range w.states {
		byDest[s.endpoint] = append(byDest[s.endpoint], s)
	}
	bad := 0
	for _, r := range w.requests {
		if r.killed {
			continue
		}
		var last *stateSample
		for i := range byDest[r.endpoint] {
			s := &byDest[r.endpoint][i]
			if s.at.After(r.start) {
				break
			}
			last = s
		}
		if last == nil || last.health != outbox.HealthBackingOff || last.backoffUntil == nil ||
			!last.backoffUntil.After(r.start.Add(100*time.Millisecond)) {
			continue
		}
		enabled := false
		for _, at := range w.enables[r.endpoint] {
			if at.After(last.at.Add(-time.Second)) && at.Before(r.start.Add(time.Second)) {
				enabled = true
			}
		}
		if !enabled {
			bad++
			if bad <= 10 {
				t.Errorf("relay %d sent message %s at %s while endpoint %s backed off until %s (seen at %s)",
					r.relay, r.message, r.start.Sub(w.started), r.endpoint, last.backoffUntil.Sub(w.started), last.at.Sub(w.started))
			}
		}
	}
}

// checkMetrics holds the relays' counters against the attempts recorded.
func (w *world) checkMetrics(t *testing.T) {
	counted := map[string]float64{}
	for _, rp := range w.relays {
		families, err := rp.reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() != "outbox_deliveries_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" {
						counted[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	rows, err := w.pool.Query(w.ctx, `SELECT outcome, count(*) FROM outbox_attempts
		WHERE coalesce(error, '') NOT IN ('the relay delivering it stopped; the receiver may have it',
		                                  'claim timed out: the relay did not record an outcome')
		GROUP BY outcome`)
	require.NoError(t, err)
	defer rows.Close()
	table := map[string]float64{}
	for rows.Next() {
		var outcome string
		var n float64
		require.NoError(t, rows.Scan(&outcome, &n))
		table[outcome] = n
	}
	for outcome, n := range counted {
		if outcome == "throttled" {
			continue
		}
		require.LessOrEqual(t, n, table[outcome], "outcome %s: counted, never more than recorded", outcome)
		if w.kills == 0 {
			require.Equal(t, table[outcome], n, "outcome %s: with no relay killed, counted as recorded", outcome)
		}
	}
}

// proxy forwards TCP connections to PostgreSQL, with a delay on each
// chunk when set, until it is cut.
type proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = to.Close()
			return
		}
	}
}

// cut closes the listener and every connection: the relay behind it can
// no longer reach the database.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
}
