package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// backlogCacheFor is how long BacklogCollector reuses what it read: a scrape
// runs four aggregate queries over the outbox tables, and without a bound a
// storm of scrapes (several Prometheus servers, a dashboard refreshing, a
// hostile client on an exposed /metrics) would be a storm of queries. Five
// seconds is below any usual scrape interval, so a single scraper always
// sees fresh values.
const backlogCacheFor = 5 * time.Second

// backlogReadShare bounds the database time a process spends on these
// readings: a reading is reused for at least backlogReadShare times as long
// as it took. With millions waiting a reading takes seconds, and every
// process (the api and each worker) reads for itself: at a fixed 5 s,
// four processes would keep more than a core of the database counting.
const backlogReadShare = 10

// Counting what waits is linear in it: about 0.8 s per million waiting
// messages before VACUUM has set their pages all-visible, 0.3 s after. A
// day's outage of a busy endpoint is millions of messages, and that is when
// the gauges matter most, so a reading may run for backlogReadBudget, in the
// background: a scrape waits for it at most backlogScrapeWait (well within
// Prometheus' default 10 s scrape timeout) and otherwise serves the
// previous reading, whose age outbox_backlog_reading_age_seconds shows.
const (
	backlogReadBudget = 30 * time.Second
	backlogScrapeWait = 2 * time.Second
)

// errNoReading is served while the first reading runs past backlogScrapeWait.
var errNoReading = errors.New("the first reading of the outbox is still running")

// BacklogCollector reports the outbox's state from the tables themselves:
// messages by status, the oldest pending age, how overdue the oldest
// deliverable message is, destinations by state and the relays alive. It
// reads the database, not process memory, so any process (api or worker)
// shows the truth, and a stalled relay is visible from outside it. The
// values are read at most once per backlogCacheFor (longer when a reading
// is slow), whatever the number of scrapes; concurrent scrapes wait for the
// one read. A reading slower than
// a scrape should wait (a backlog of millions) goes on in the background
// while scrapes serve the previous one. Close stops a reading in progress.
type BacklogCollector struct {
	read func(context.Context) (scrape, error)
	now  func() time.Time

	// ctx ends with Close: a reading in progress must not hold a pool
	// connection (and so the pool's Close) for its whole budget.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	cached   scrape
	cacheErr error
	takenAt  time.Time     // when the cached reading started: its snapshot's time
	readAt   time.Time     // when it ended: the cache window counts from here
	fresh    time.Duration // how long it is reused: backlogCacheFor, or more for a slow one
	running  chan struct{}

	messages     *prometheus.Desc
	oldestAge    *prometheus.Desc
	overdue      *prometheus.Desc
	destinations *prometheus.Desc
	poisoned     *prometheus.Desc
	relays       *prometheus.Desc
	up           *prometheus.Desc
	readingAge   *prometheus.Desc
	ahead        *prometheus.Desc
	oldest       *prometheus.Desc
}

// scrape is one reading of the tables.
type scrape struct {
	messages   backlogTotals
	states     outboxdb.EndpointStatesRow
	relays     int64
	partitions Partitions
	// poisoned counts, by endpoint, the messages not settled that spent
	// half their attempts or more; endpoints without any are left out.
	poisoned map[uuid.UUID]int64
}

// CollectorOption changes what a BacklogCollector reports.
type CollectorOption func(*collectorConfig)

type collectorConfig struct{ poisoned int32 }

// WithPoisonedMessages makes the collector report the messages on their
// way to failing (outbox_poisoned_messages): those that have spent half
// of maxAttempts, the relay's cap (OUTBOX_MAX_ATTEMPTS), or more. Only the
// process that knows the cap (the worker) can tell; without the option
// the gauge is left out.
func WithPoisonedMessages(maxAttempts int) CollectorOption {
	return func(c *collectorConfig) { c.poisoned = int32((max(maxAttempts, 1) + 1) / 2) }
}

// NewBacklogCollector returns a collector reading from pool. Close it
// before closing pool.
func NewBacklogCollector(pool *pgxpool.Pool, opts ...CollectorOption) *BacklogCollector {
	var cfg collectorConfig
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &BacklogCollector{
		read:   func(ctx context.Context) (scrape, error) { return readScrape(ctx, pool, cfg.poisoned) },
		now:    time.Now,
		ctx:    ctx,
		cancel: cancel,
		messages: prometheus.NewDesc("outbox_messages",
			"Outbox messages by status (delivered history is not counted here).", []string{"status"}, nil),
		oldestAge: prometheus.NewDesc("outbox_oldest_pending_age_seconds",
			"Age of the oldest pending message; grows when the relay is stalled or a destination is down or paused.", nil, nil),
		overdue: prometheus.NewDesc("outbox_oldest_due_overdue_seconds",
			"How long the oldest deliverable message has waited past its due time (paused and backing-off destinations excluded); stays near the poll interval unless the relay is stalled or saturated.", nil, nil),
		destinations: prometheus.NewDesc("outbox_destinations",
			"Webhook endpoints by state: healthy, backing_off, paused.", []string{"state"}, nil),
		poisoned: prometheus.NewDesc("outbox_poisoned_messages",
			"Messages not settled that have spent at least half their attempts (OUTBOX_MAX_ATTEMPTS), by endpoint id: poison messages on their way to failing; endpoints without any have no series.", []string{"endpoint"}, nil),
		relays: prometheus.NewDesc("outbox_relays",
			"Relay processes alive: heartbeating within their relay timeout (a killed worker is not counted, even before another relay reaps it).", nil, nil),
		up: prometheus.NewDesc("outbox_backlog_scrape_success",
			"1 when the reading of the outbox tables served by this scrape succeeded (they are read at most every 5 s, whatever the scrape rate).", nil, nil),
		ahead: prometheus.NewDesc("outbox_partitions_ahead_seconds",
			"How long until the writes reach the end of the newest partition of the outbox tables, which the worker's prune job makes OUTBOX_PARTITIONS_AHEAD ahead: order transactions fail at zero.", nil, nil),
		oldest: prometheus.NewDesc("outbox_partition_oldest_age_seconds",
			"How long ago the time of the oldest partition's end passed, by what it holds (held_by: claimed, pending or failed messages; settled ones only, dropped once past OUTBOX_RETENTION; none): above OUTBOX_RETENTION plus OUTBOX_PARTITION_SPAN, something keeps it.", []string{"held_by"}, nil),
		readingAge: prometheus.NewDesc("outbox_backlog_reading_age_seconds",
			"Age of the reading the outbox gauges come from: under 5 s while counting is quick; with a backlog of millions a reading is reused for ten times as long as it took, and one slower than a scrape waits runs on while the previous one is served.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.messages, c.oldestAge, c.overdue, c.destinations, c.poisoned, c.relays, c.up, c.readingAge, c.ahead, c.oldest} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	b, age, err := c.get()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.up, 1)
	gauge(c.readingAge, age.Seconds())
	gauge(c.messages, float64(b.messages.Pending), outbox.StatusPending)
	gauge(c.messages, float64(b.messages.Claimed), outbox.StatusClaimed)
	gauge(c.messages, float64(b.messages.Failed), outbox.StatusFailed)
	gauge(c.oldestAge, b.messages.OldestPendingAgeSeconds)
	gauge(c.overdue, b.messages.OldestDueSeconds)
	gauge(c.destinations, float64(b.states.Healthy), outbox.HealthHealthy)
	gauge(c.destinations, float64(b.states.BackingOff), outbox.HealthBackingOff)
	gauge(c.destinations, float64(b.states.Paused), outbox.HealthPaused)
	gauge(c.relays, float64(b.relays))
	gauge(c.ahead, b.partitions.AheadSeconds)
	if b.partitions.Count > 0 {
		held := b.partitions.OldestHeldBy
		if held == "" {
			held = "none"
		}
		gauge(c.oldest, b.partitions.OldestAgeSeconds, held)
	}
	for id, n := range b.poisoned {
		gauge(c.poisoned, float64(n), id.String())
	}
}

// get returns the latest reading and its age, starting a new one once the
// last is backlogCacheFor old (or backlogReadShare times what it took, if
// more) and waiting for it at most backlogScrapeWait.
// A failed reading is cached too: a database in trouble is not asked again
// by every scrape.
func (c *BacklogCollector) get() (scrape, time.Duration, error) {
	c.mu.Lock()
	if c.running == nil && (c.readAt.IsZero() || c.now().Sub(c.readAt) >= c.fresh) {
		c.running = make(chan struct{})
		go c.refresh(c.running)
	}
	running := c.running
	c.mu.Unlock()
	if running != nil {
		wait := time.NewTimer(backlogScrapeWait)
		defer wait.Stop()
		select {
		case <-running:
		case <-wait.C:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.takenAt.IsZero() {
		return scrape{}, 0, errNoReading
	}
	return c.cached, c.now().Sub(c.takenAt), c.cacheErr
}

// refresh reads the tables into the cache and closes done.
func (c *BacklogCollector) refresh(done chan struct{}) {
	defer close(done)
	taken := c.now()
	ctx, cancel := context.WithTimeout(c.ctx, backlogReadBudget)
	defer cancel()
	s, err := c.read(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cached, c.cacheErr, c.takenAt, c.readAt, c.running = s, err, taken, c.now(), nil
	c.fresh = max(backlogCacheFor, backlogReadShare*c.readAt.Sub(taken))
}

// Close stops a reading in progress and waits for it to end. Scrapes after
// Close report no values.
func (c *BacklogCollector) Close() {
	c.cancel()
	c.mu.Lock()
	running := c.running
	c.mu.Unlock()
	if running != nil {
		<-running
	}
}

func readScrape(ctx context.Context, pool *pgxpool.Pool, poisoned int32) (scrape, error) {
	s, err := withBacklog(ctx, pool, poisoned, func(q *outboxdb.Queries, b backlog) (s scrape, err error) {
		s.messages = b.totals()
		for _, r := range b {
			if r.Poisoned > 0 {
				if s.poisoned == nil {
					s.poisoned = map[uuid.UUID]int64{}
				}
				s.poisoned[r.Destination] = r.Poisoned
			}
		}
		if s.states, err = q.EndpointStates(ctx); err != nil {
			return s, err
		}
		if s.relays, err = q.RelaysCount(ctx); err != nil {
			return s, err
		}
		s.partitions, err = readPartitions(ctx, q)
		return s, err
	})
	if err != nil {
		return scrape{}, fmt.Errorf("scraping the outbox: %w", err)
	}
	return s, nil
}
