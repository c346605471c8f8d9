package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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

// River queues the relay uses. Claims and maintenance have their own queues
// so a flood of deliveries never delays the next claim or prune.
const (
	QueueClaim   = "outbox_claim"
	QueueDeliver = "outbox_deliver"
	QueuePrune   = "outbox_prune"
)

// RelayConfig tunes the relay. The zero value of a field means its default.
type RelayConfig struct {
	// PollInterval is how often a claim job looks for due messages when the
	// relay is idle; a backlog is drained without waiting for it.
	PollInterval time.Duration
	// BatchSize bounds how many messages one claim statement takes.
	BatchSize int
	// MaxAttempts is the cap after which a message is marked failed.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the exponential backoff between attempts.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// ClaimTimeout is how long a claim may stay unsettled before it is taken
	// to mean its relay died, and the message is returned to pending.
	ClaimTimeout time.Duration
	// DeliveryTimeout bounds one webhook request.
	DeliveryTimeout time.Duration
	// Retention is how long delivered rows are kept as the audit record.
	Retention time.Duration
	// PruneInterval is how often the prune job runs.
	PruneInterval time.Duration
	// MaxInFlight bounds claimed-but-unsettled messages across all relays, so
	// claims never run so far ahead of delivery that they time out.
	MaxInFlight int
	// DeliverBatch is how many messages for one endpoint go in one deliver job.
	DeliverBatch int
	// DeliverConcurrency is how many requests one deliver job has in flight.
	DeliverConcurrency int
	// DeliverWorkers is how many deliver jobs one worker process runs at once.
	DeliverWorkers int
	// TracerProvider, when set, traces the relay: a span per delivery, in the
	// trace of the request that enqueued the message, and River's jobs
	// (otelriver). Nil means tracing off; a message that carries a trace
	// context still passes it on to its receiver.
	TracerProvider trace.TracerProvider
}

// DefaultRelayConfig returns the defaults, chosen for webhook delivery on a
// small machine: sub-second latency when idle, seconds-to-minutes of backoff,
// and a week of audit history.
func DefaultRelayConfig() RelayConfig {
	return RelayConfig{
		PollInterval:       50 * time.Millisecond, // was 200 ms: p50 110 → 29 ms at 200 orders/s (docs/PERFORMANCE.md)
		BatchSize:          500,
		MaxAttempts:        10,
		BackoffBase:        time.Second,
		BackoffMax:         time.Hour,
		ClaimTimeout:       5 * time.Minute,
		DeliveryTimeout:    10 * time.Second,
		Retention:          7 * 24 * time.Hour,
		PruneInterval:      time.Hour,
		MaxInFlight:        5000,
		DeliverBatch:       200, // was 50: −27 % CPU per message (docs/PERFORMANCE.md, knobs)
		DeliverConcurrency: 16,
		DeliverWorkers:     50,
	}
}

// withDefaults fills zero fields from DefaultRelayConfig.
func (c RelayConfig) withDefaults() RelayConfig {
	d := DefaultRelayConfig()
	or := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	ori := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	or(&c.PollInterval, d.PollInterval)
	or(&c.BackoffBase, d.BackoffBase)
	or(&c.BackoffMax, d.BackoffMax)
	or(&c.ClaimTimeout, d.ClaimTimeout)
	or(&c.DeliveryTimeout, d.DeliveryTimeout)
	or(&c.Retention, d.Retention)
	or(&c.PruneInterval, d.PruneInterval)
	ori(&c.BatchSize, d.BatchSize)
	ori(&c.MaxAttempts, d.MaxAttempts)
	ori(&c.MaxInFlight, d.MaxInFlight)
	ori(&c.DeliverBatch, d.DeliverBatch)
	ori(&c.DeliverConcurrency, d.DeliverConcurrency)
	ori(&c.DeliverWorkers, d.DeliverWorkers)
	return c
}

// FieldError is a RelayConfig problem, naming the field it is about so a
// caller can name its own setting (an environment variable, a flag).
type FieldError struct {
	Field string
	Msg   string
}

// Error implements error.
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Validate reports settings that cannot work together, as *FieldError values
// joined with errors.Join.
func (c RelayConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if c.BackoffMax < c.BackoffBase {
		fail("BackoffMax", "%s is below the backoff base %s", c.BackoffMax, c.BackoffBase)
	}
	// A claim must outlive the longest deliver job, or a healthy but slow job
	// would see its rows re-claimed under it and every message sent twice.
	if longest := c.deliverJobTimeout(c.DeliverBatch); c.ClaimTimeout <= longest {
		fail("ClaimTimeout", "%s must exceed the longest deliver job, %s (delivery timeout %s x (deliver batch %d / concurrency %d + 1) + 1s)",
			c.ClaimTimeout, longest, c.DeliveryTimeout, c.DeliverBatch, c.DeliverConcurrency)
	}
	for field, v := range map[string]int{"BatchSize": c.BatchSize, "MaxAttempts": c.MaxAttempts, "MaxInFlight": c.MaxInFlight,
		"DeliverBatch": c.DeliverBatch, "DeliverConcurrency": c.DeliverConcurrency, "DeliverWorkers": c.DeliverWorkers} {
		if v < 0 {
			fail(field, "must be positive, got %d", v)
		}
	}
	for field, v := range map[string]time.Duration{"PollInterval": c.PollInterval, "BackoffBase": c.BackoffBase,
		"ClaimTimeout": c.ClaimTimeout, "DeliveryTimeout": c.DeliveryTimeout, "Retention": c.Retention, "PruneInterval": c.PruneInterval} {
		if v < 0 {
			fail(field, "must be positive, got %s", v)
		}
	}
	return errors.Join(errs...)
}

// deliverJobTimeout is how long a deliver job of n messages may run: its
// requests in rounds of DeliverConcurrency, plus a margin for loading the
// rows and recording the outcome.
func (c RelayConfig) deliverJobTimeout(n int) time.Duration {
	rounds := (n + c.DeliverConcurrency - 1) / c.DeliverConcurrency
	return time.Duration(rounds+1)*c.DeliveryTimeout + time.Second
}

// backoff is the delay before attempt+1: exponential from BackoffBase, capped
// at BackoffMax, with "equal jitter" (half fixed, half random) so a burst of
// failures against one endpoint does not come back as one burst.
func (c RelayConfig) backoff(attempt int) time.Duration {
	d := c.BackoffBase
	for i := 1; i < attempt && d < c.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.BackoffMax)
	half := d / 2
	return half + rand.N(half+1)
}

// Relay claims, delivers and prunes outbox messages as River jobs. Register
// its workers and periodic jobs on a River client (see cmd/worker); any number
// of processes may run one against the same database.
type Relay struct {
	pool      *pgxpool.Pool
	cfg       RelayConfig
	transport Transport
	logger    *slog.Logger
	metrics   *Metrics
	tracer    trace.Tracer
	// progressAt is when this relay last claimed something (Unix nanos),
	// or when it started.
	progressAt atomic.Int64
}

// NewRelay returns a relay delivering through transport. metrics may be nil.
func NewRelay(pool *pgxpool.Pool, cfg RelayConfig, transport Transport, logger *slog.Logger, metrics *Metrics) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuring relay: %w", err)
	}
	if metrics == nil {
		metrics = NewMetrics()
	}
	r := &Relay{pool: pool, cfg: cfg.withDefaults(), transport: transport, logger: logger, metrics: metrics, tracer: cfg.tracer()}
	r.progressAt.Store(time.Now().UnixNano())
	return r, nil
}

// ErrStalled is returned by CheckStalled when due messages wait while the
// relay makes no progress.
var ErrStalled = errors.New("outbox: relay stalled")

// CheckStalled reports a relay that is running but not moving: the oldest
// due message has waited longer than threshold past its due time, and this
// relay has claimed nothing for as long. A backlog that is draining, or
// messages backing off for a down endpoint, are not a stall.
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

// Config returns the relay's effective settings.
func (r *Relay) Config() RelayConfig { return r.cfg }

// AddWorkers registers the claim, deliver and prune workers.
func (r *Relay) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &claimWorker{relay: r})
	river.AddWorker(workers, &deliverWorker{relay: r})
	river.AddWorker(workers, &pruneWorker{relay: r})
}

// Queues returns the River queues the relay needs, sized from its config.
func (r *Relay) Queues() map[string]river.QueueConfig {
	return map[string]river.QueueConfig{
		QueueClaim:   {MaxWorkers: 1},
		QueueDeliver: {MaxWorkers: r.cfg.DeliverWorkers},
		QueuePrune:   {MaxWorkers: 1},
	}
}

// PeriodicJobs returns the timers River's leader runs: the prune, and a
// slow claim as a safety net for a process that runs the River client
// without TickClaims (the fast path). There is one of each however many
// workers run.
func (r *Relay) PeriodicJobs() []*river.PeriodicJob {
	// Unique while waiting or running: a long prune covers the ticks that
	// pass meanwhile.
	once := river.UniqueOpts{ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending,
		rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}
	return []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(max(r.cfg.PollInterval, claimSafetyNet)),
			func() (river.JobArgs, *river.InsertOpts) { return ClaimArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(r.cfg.PruneInterval),
			func() (river.JobArgs, *river.InsertOpts) {
				return PruneArgs{}, &river.InsertOpts{UniqueOpts: once}
			}, &river.PeriodicJobOpts{RunOnStart: true}),
	}
}

// claimSafetyNet is the leader's claim interval: slow, because TickClaims in
// every worker is what keeps latency at the poll interval.
const claimSafetyNet = time.Second

// NewRiverClient returns a River client that runs this relay's jobs; run
// TickClaims beside it to start claims. River's
// timers are set against the outbox's: a deliver job stuck in a dead process
// is rescued only after the claim timeout has released its rows, so the
// rescued job finds a stale token and does nothing.
func (r *Relay) NewRiverClient() (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	r.AddWorkers(workers)
	client, err := river.NewClient(riverpgxv5.New(r.pool), &river.Config{
		Middleware: r.Middleware(),
		// River reports routine progress at info every few seconds; the
		// relay's own metrics say that better, so River speaks up only for
		// warnings and errors.
		Logger:       slog.New(minLevel{r.logger.Handler(), slog.LevelWarn}).With(slog.String("component", "river")),
		Queues:       r.Queues(),
		Workers:      workers,
		PeriodicJobs: r.PeriodicJobs(),
		// Deliver jobs inserted by a claim should start at once.
		FetchCooldown:               10 * time.Millisecond,
		FetchPollInterval:           r.cfg.PollInterval,
		RescueStuckJobsAfter:        r.cfg.ClaimTimeout + time.Minute,
		CompletedJobRetentionPeriod: time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("creating river client: %w", err)
	}
	return client, nil
}

// Middleware returns the River middleware the relay's client runs: River's
// OpenTelemetry middleware when tracing is on (a span per job, and the claim
// job's context carried to the deliver jobs it inserts as a link), else none,
// so tracing off costs the jobs nothing.
func (r *Relay) Middleware() []rivertype.Middleware {
	if r.cfg.TracerProvider == nil {
		return nil
	}
	return []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
		TracerProvider:              r.cfg.TracerProvider,
		EnableTracePropagation:      true,
		EnableWorkSpanJobKindSuffix: true,
	})}
}

// TickClaims looks for work every poll interval until ctx is done, and
// inserts a claim job when there is some: a due message, or a claim past the
// claim timeout. Run it beside the River client, in every worker.
//
// Two reasons it is not a River periodic job. River inserts those from its
// elected leader only, and a leader killed without resigning keeps its lease
// for about 15 seconds: with the leader's timer alone, a SIGKILL would stop
// every claim (and every stale-claim release) cluster-wide for that long.
// And an idle relay then costs one two-probe query per tick, not a River job
// inserted, fetched and completed per tick.
func (r *Relay) TickClaims(ctx context.Context, client *river.Client[pgx.Tx]) {
	ticker := time.NewTicker(r.cfg.PollInterval)
	defer ticker.Stop()
	q := outboxdb.New(r.pool)
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		r.metrics.polls.Inc()
		due, err := q.MessageWorkDue(ctx, r.cfg.ClaimTimeout.Seconds())
		if err == nil && due {
			_, err = client.Insert(ctx, ClaimArgs{}, nil)
		}
		if err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			// The database is unreachable: say so, but not every tick.
			warned = time.Now()
			r.logger.WarnContext(ctx, "looking for due messages", slog.Any("error", err))
		}
	}
}

// ClaimArgs starts one claim: release stale claims, then claim due messages
// batch after batch until none are left or in-flight work is at its bound.
type ClaimArgs struct{}

// Kind implements river.JobArgs.
func (ClaimArgs) Kind() string { return "outbox_claim" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (ClaimArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueClaim, MaxAttempts: 1}
}

type claimWorker struct {
	river.WorkerDefaults[ClaimArgs]
	relay *Relay
}

// claimBudget bounds one claim job's drain loop, so a worker shutting down
// or a leader change never waits on an endless job; the next tick goes on.
const claimBudget = 10 * time.Second

func (w *claimWorker) Timeout(*river.Job[ClaimArgs]) time.Duration {
	return claimBudget + 30*time.Second
}

func (w *claimWorker) Work(ctx context.Context, job *river.Job[ClaimArgs]) error {
	r := w.relay
	r.metrics.claimRuns.Inc()
	q := outboxdb.New(r.pool)
	released, err := q.MessageReleaseStale(ctx, r.cfg.ClaimTimeout.Seconds(), int32(r.cfg.MaxAttempts))
	if err != nil {
		return fmt.Errorf("releasing stale claims: %w", err)
	}
	if released > 0 {
		r.metrics.released.Add(float64(released))
		r.logger.WarnContext(ctx, "released stale claims", slog.Int64("count", released),
			slog.Duration("claim_timeout", r.cfg.ClaimTimeout))
	}

	deadline := time.Now().Add(claimBudget)
	for time.Now().Before(deadline) {
		inFlight, err := q.MessageClaimedCount(ctx)
		if err != nil {
			return fmt.Errorf("counting claimed messages: %w", err)
		}
		room := min(r.cfg.BatchSize, r.cfg.MaxInFlight-int(inFlight))
		if room <= 0 {
			return nil
		}
		n, err := r.claimBatch(ctx, room)
		if err != nil {
			return err
		}
		if n < room {
			return nil // caught up; the next tick looks again
		}
	}
	return nil
}

// claimBatch claims up to limit messages and, in the same transaction,
// inserts the deliver jobs for them: either both happen or neither, so no
// claimed row is ever left without a job to deliver it.
func (r *Relay) claimBatch(ctx context.Context, limit int) (int, error) {
	token := uuid.New()
	var claimed int
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := outboxdb.New(tx).MessageClaim(ctx, token, int32(limit))
		if err != nil {
			return fmt.Errorf("claiming messages: %w", err)
		}
		claimed = len(rows)
		if claimed == 0 {
			return nil
		}
		// One job per endpoint and chunk: a slow or dead endpoint's job
		// never holds up another endpoint's messages.
		byDest := map[uuid.UUID][]uuid.UUID{}
		var order []uuid.UUID
		for _, row := range rows {
			if _, ok := byDest[row.Destination]; !ok {
				order = append(order, row.Destination)
			}
			byDest[row.Destination] = append(byDest[row.Destination], row.ID)
		}
		var params []river.InsertManyParams
		for _, dest := range order {
			ids := byDest[dest]
			for len(ids) > 0 {
				n := min(len(ids), r.cfg.DeliverBatch)
				params = append(params, river.InsertManyParams{Args: DeliverArgs{
					ClaimToken: token, Destination: dest, MessageIDs: ids[:n:n],
				}})
				ids = ids[n:]
			}
		}
		if _, err := river.ClientFromContext[pgx.Tx](ctx).InsertManyTx(ctx, tx, params); err != nil {
			return fmt.Errorf("inserting deliver jobs: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.metrics.claimed.Add(float64(claimed))
	if claimed > 0 {
		r.progressAt.Store(time.Now().UnixNano())
	}
	return claimed, nil
}

// PruneArgs starts one prune of delivered rows past the retention.
type PruneArgs struct{}

// Kind implements river.JobArgs.
func (PruneArgs) Kind() string { return "outbox_prune" }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (PruneArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueuePrune, MaxAttempts: 1}
}

type pruneWorker struct {
	river.WorkerDefaults[PruneArgs]
	relay *Relay
}

// pruneBatch keeps each delete short, so its locks and WAL never stall the
// claim or the order transactions running beside it.
const pruneBatch = 5000

func (w *pruneWorker) Timeout(*river.Job[PruneArgs]) time.Duration { return 30 * time.Minute }

func (w *pruneWorker) Work(ctx context.Context, job *river.Job[PruneArgs]) error {
	n, err := w.relay.Prune(ctx, time.Now().Add(-w.relay.cfg.Retention))
	if n > 0 {
		w.relay.logger.InfoContext(ctx, "pruned delivered messages", slog.Int64("count", n),
			slog.Duration("retention", w.relay.cfg.Retention))
	}
	return err
}

// Prune deletes delivered messages delivered before cutoff, in batches, and
// returns how many it deleted. Pending, claimed and failed rows are kept.
func (r *Relay) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	q := outboxdb.New(r.pool)
	var total int64
	for {
		n, err := q.MessagesPrune(ctx, cutoff, pruneBatch)
		total += n
		r.metrics.pruned.Add(float64(n))
		if err != nil {
			return total, fmt.Errorf("pruning delivered messages: %w", err)
		}
		if n < pruneBatch {
			return total, nil
		}
	}
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
