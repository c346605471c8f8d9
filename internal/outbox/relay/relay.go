// Package relay is the outbox's delivery engine: it delivers the messages
// that Enqueue committed, each destination on its own, and keeps the
// promises docs/design.md lists (isolation, recovery, per-key order,
// retries that outlast an outage). A Relay runs in cmd/worker; any number
// of them may run against one database.
package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// River queues the relay uses: deliveries, and the prune on its own so a
// flood of deliveries never delays it.
const (
	queueDeliver = "outbox_deliver"
	queuePrune   = "outbox_prune"
)

// Relay delivers committed outbox messages. Any number of relay processes may
// run against one database; together they serve every destination, each
// destination by one deliver job at a time. Its parts, each in a file of
// its own:
//
//   - dispatch.go: every relay looks every poll interval for destinations
//     with due messages that no live job serves, and inserts a River deliver
//     job for each.
//   - session.go: the deliver job takes the destination's lease, claims its
//     due messages into the room its pace allows, sends them, and after a
//     time slice makes way for the next job. pace.go is the destination's
//     health and pace: how many requests at once, when to back off as a
//     whole, what an answer changes. outcome.go judges each answer;
//     record.go writes what came of it.
//   - order.go: per-key order, the claim and the promotion.
//   - liveness.go: every relay heartbeats, and acts only while it knows
//     itself alive; recovery.go releases the claims of relays that are not.
//   - retention.go: the prune and the discard of deleted endpoints'
//     messages, run by River's leader.
//
// So a slow, hanging or failing destination holds at most one River worker
// and its window of requests, never the others' share, and a message's
// attempts count only requests that were made (or, for a destination whose
// secret cannot be opened, the ones that could not be).
type Relay struct {
	pool      *pgxpool.Pool
	cfg       Config
	transport Transport
	logger    *slog.Logger
	metrics   *Metrics
	tracer    trace.Tracer
	// id names this relay process in outbox_relays and on its claims.
	id uuid.UUID
	// claimedAt is when this relay last claimed a message (Unix nanos, 0
	// before the first); the heartbeat writes it to outbox_relays.
	claimedAt atomic.Int64
	// progressAt is when this relay last claimed something (Unix nanos),
	// or when it started.
	progressAt atomic.Int64
	// started is when the relay was made, and beatSent how long after it
	// the latest answered heartbeat was sent: the relay's liveness, on the
	// monotonic clock (alive).
	started  time.Time
	beatSent atomic.Int64
	// now is the relay's clock (time.Now; another in the tests of a
	// skewed clock), and skew how far the database's is ahead of it (in
	// nanoseconds, measured at each heartbeat): dbTime turns one into the
	// other for every time the relay writes.
	now  func() time.Time
	skew atomic.Int64

	client *river.Client[pgx.Tx]
	// drain is closed when Stop begins: deliver jobs stop claiming, finish
	// what they have in flight and settle.
	drain    chan struct{}
	stopOnce sync.Once
	// stopDispatch and stopKeepAlive end the loops Start runs.
	stopDispatch, stopKeepAlive context.CancelFunc
	loops                       sync.WaitGroup

	// Wake-ups (listen.go, and a job's end): the dispatch loop takes one
	// from dispatchNow; sessions holds the wake-up channel of each deliver
	// job running here, by destination.
	dispatchNow chan struct{}
	wakeMu      sync.Mutex
	sessions    map[uuid.UUID]chan struct{}

	// othersDue: at the last dispatch, deliver jobs waited for a worker,
	// or more destinations were due than it could take. Then a job with
	// nothing left to do ends instead of lingering, and wakes the dispatch
	// as it ends (session.go).
	othersDue atomic.Bool

	mu sync.Mutex
	// unsettled holds the final writes of jobs that could not reach the
	// database as they ended; the recovery pass retries them.
	unsettled []func(context.Context) error
	// unsettledWarned is when a retry of them last failed aloud.
	unsettledWarned time.Time
}

// New returns a relay delivering through transport. metrics may be nil.
func New(pool *pgxpool.Pool, cfg Config, transport Transport, logger *slog.Logger, metrics *Metrics) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuring relay: %w", err)
	}
	if metrics == nil {
		metrics = NewMetrics()
	}
	r := &Relay{pool: pool, cfg: cfg.withDefaults(), transport: transport, logger: logger, metrics: metrics,
		tracer: cfg.tracer(), id: uuid.New(), drain: make(chan struct{}),
		dispatchNow: make(chan struct{}, 1), sessions: map[uuid.UUID]chan struct{}{}, now: time.Now,
		started: time.Now()}
	r.progressAt.Store(time.Now().UnixNano())
	return r, nil
}

// dbTime is t, a time of the relay's clock, on the database's clock: what
// the relay writes is compared with now() there (a backoff's end, a prune's
// cutoff), so a worker whose clock is an hour ahead would otherwise back a
// destination off for an hour, or prune what is not yet due.
func (r *Relay) dbTime(t time.Time) time.Time { return t.Add(time.Duration(r.skew.Load())) }

// dbNow is the database's clock, as the relay last measured it.
func (r *Relay) dbNow() time.Time { return r.dbTime(r.now()) }

// measureSkew keeps how far the database's clock, read as dbNow by a
// statement sent at sent, is ahead of the relay's: the database read it
// about halfway through the round trip.
func (r *Relay) measureSkew(sent, dbNow time.Time) {
	back := r.now()
	r.skew.Store(int64(dbNow.Sub(sent.Add(back.Sub(sent) / 2))))
}

// Start registers the relay, starts its River client and its loops
// (dispatch, heartbeat, recovery and, with Listen, the listener), and
// returns. The relay runs until Stop; ctx
// only bounds starting (its values, such as a logger's, are kept).
func (r *Relay) Start(ctx context.Context) error {
	if r.client != nil {
		return errors.New("outbox: relay already started")
	}
	host, _ := os.Hostname()
	sent, since := r.now(), time.Since(r.started)
	dbNow, err := outboxdb.New(r.pool).RelayRegister(ctx, r.register(host))
	if err != nil {
		return fmt.Errorf("registering relay: %w", err)
	}
	// Registering is the first heartbeat.
	r.beatSent.Store(int64(since))
	r.measureSkew(sent, dbNow)
	client, err := r.newRiverClient()
	if err != nil {
		// Not left registered: a relay that never ran has nothing to release.
		_ = outboxdb.New(r.pool).RelayUnregister(context.WithoutCancel(ctx), r.id)
		return err
	}
	// Set before River starts: a job that settles reads it.
	r.client = client
	// River hard-stops (cancels running jobs) when its start context is
	// cancelled, which would cut off in-flight deliveries and skip the
	// grace period; Stop does the stopping instead.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		r.client = nil
		_ = outboxdb.New(r.pool).RelayUnregister(context.WithoutCancel(ctx), r.id)
		return fmt.Errorf("starting river: %w", err)
	}
	base := context.WithoutCancel(ctx)
	dispatchCtx, stopDispatch := context.WithCancel(base)
	keepAliveCtx, stopKeepAlive := context.WithCancel(base)
	r.stopDispatch, r.stopKeepAlive = stopDispatch, stopKeepAlive
	r.loops.Go(func() { r.dispatchLoop(dispatchCtx) })
	r.loops.Go(func() { r.keepAlive(keepAliveCtx) })
	r.loops.Go(func() { r.recoverLoop(keepAliveCtx) })
	if r.cfg.Listen {
		r.loops.Go(func() { r.listen(dispatchCtx) })
	}
	r.logger.InfoContext(ctx, "relay started", slog.String("relay_id", r.id.String()),
		slog.Duration("poll_interval", r.cfg.PollInterval),
		slog.Int("destination_concurrency", r.cfg.DestinationConcurrency),
		slog.Int("max_attempts", r.cfg.MaxAttempts), slog.Bool("listen", r.cfg.Listen))
	return nil
}

// Stop stops the relay gracefully: it stops dispatching, lets deliver jobs
// finish the requests they have in flight (claiming nothing new) until ctx
// is done, then cancels the rest. Either way every job records what it sent
// and returns what it did not send to pending before Stop returns, and the
// relay leaves outbox_relays, so no claim of it waits for a timeout.
func (r *Relay) Stop(ctx context.Context) error {
	if r.client == nil {
		return nil
	}
	var err error
	r.stopOnce.Do(func() { err = r.stop(ctx) })
	return err
}

func (r *Relay) stop(ctx context.Context) error {
	r.stopDispatch()
	close(r.drain)
	var errs []error
	if err := r.client.Stop(ctx); err != nil {
		r.logger.WarnContext(ctx, "relay did not stop in time; cancelling deliveries in flight", slog.Any("error", err))
		hardCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.client.StopAndCancel(hardCtx); err != nil {
			errs = append(errs, fmt.Errorf("stopping river: %w", err))
		}
	}
	r.stopKeepAlive()
	r.loops.Wait()
	cleanCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.leave(cleanCtx); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		r.logger.InfoContext(ctx, "relay stopped", slog.String("relay_id", r.id.String()))
	}
	return errors.Join(errs...)
}

// draining reports whether Stop has begun.
func (r *Relay) draining() bool {
	select {
	case <-r.drain:
		return true
	default:
		return false
	}
}

func (r *Relay) newRiverClient() (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &deliverWorker{relay: r})
	river.AddWorker(workers, &pruneWorker{relay: r})
	river.AddWorker(workers, &orphanWorker{relay: r})
	river.AddWorker(workers, &choreWorker{relay: r})
	var middleware []rivertype.Middleware
	if r.cfg.TracerProvider != nil {
		// A span per job; tracing off costs the jobs nothing.
		middleware = []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
			TracerProvider:              r.cfg.TracerProvider,
			EnableTracePropagation:      true,
			EnableWorkSpanJobKindSuffix: true,
		})}
	}
	client, err := river.NewClient(riverpgxv5.New(r.pool), &river.Config{
		// River's client id is the relay's, so River's elected leader
		// (river_leader) names a row of outbox_relays.
		ID:         r.id.String(),
		Middleware: middleware,
		// River reports routine progress at info every few seconds; the
		// relay's own metrics say that better, so River speaks up only for
		// warnings and errors.
		Logger: slog.New(minLevel{r.logger.Handler(), slog.LevelWarn}).With(slog.String("component", "river")),
		Queues: map[string]river.QueueConfig{
			queueDeliver: {MaxWorkers: r.cfg.DeliverWorkers},
			queuePrune:   {MaxWorkers: 1},
		},
		Workers: workers,
		// The prune and the chores come from River's elected leader: one
		// however many relays run, and a late one costs nothing.
		PeriodicJobs: r.periodicJobs(),
		// Deliver jobs should start as soon as they are inserted: River
		// announces each insert (LISTEN/NOTIFY) and its workers fetch
		// within FetchCooldown. Its poll is the fallback for a lost
		// notification, at River's default of a second: at every poll
		// interval it cost each relay, idle or not, a query for nothing
		// (a third of an idle relay's CPU), and took nothing off the
		// latency (the same at 200 and 1,000 orders/s).
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: time.Second,
		// A job stuck in a dead process is rescued only after the longest
		// any job may run; recovering a dead relay's deliveries does not
		// wait for this (liveness.go does it within RelayTimeout).
		RescueStuckJobsAfter:        pruneTimeout + time.Minute,
		CompletedJobRetentionPeriod: time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("creating river client: %w", err)
	}
	return client, nil
}

// periodicJobs are the prune job and one job per chore.
func (r *Relay) periodicJobs() []*river.PeriodicJob {
	// Unique while waiting or running: a long run covers the ticks that pass
	// meanwhile.
	unique := river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending,
		rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}
	jobs := []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(r.cfg.PruneInterval),
			func() (river.JobArgs, *river.InsertOpts) {
				return pruneArgs{}, &river.InsertOpts{UniqueOpts: unique}
			}, &river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(orphanInterval),
			func() (river.JobArgs, *river.InsertOpts) {
				return orphanArgs{}, &river.InsertOpts{UniqueOpts: unique}
			}, &river.PeriodicJobOpts{RunOnStart: true}),
	}
	for _, c := range r.cfg.Chores {
		jobs = append(jobs, river.NewPeriodicJob(river.PeriodicInterval(cmp.Or(c.Interval, r.cfg.PruneInterval)),
			func() (river.JobArgs, *river.InsertOpts) {
				return choreArgs{Name: c.Name}, &river.InsertOpts{UniqueOpts: unique}
			}, &river.PeriodicJobOpts{RunOnStart: true}))
	}
	return jobs
}

// ErrStalled is returned by CheckStalled when due messages wait while the
// relay makes no progress.
var ErrStalled = errors.New("outbox: relay stalled")

// CheckStalled reports a relay that is running but not moving: the oldest
// deliverable message has waited longer than threshold past its due time,
// and this relay has claimed nothing for as long. A backlog that is
// draining, messages backing off, and endpoints paused or backing off as a
// whole are not a stall.
func (r *Relay) CheckStalled(ctx context.Context, threshold time.Duration) error {
	overdue, err := outboxdb.New(r.pool).MessageOverdue(ctx)
	if err != nil {
		return fmt.Errorf("reading oldest due message: %w", err)
	}
	idle := time.Since(time.Unix(0, r.progressAt.Load()))
	if wait := time.Duration(overdue * float64(time.Second)); wait > threshold && idle > threshold {
		return fmt.Errorf("%w: the oldest due message has waited %s and this relay claimed nothing for %s",
			ErrStalled, wait.Round(time.Second), idle.Round(time.Second))
	}
	return nil
}

// minLevel drops records below min before they reach the wrapped handler.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}
