package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Metrics are the relay's counters. Progress (polls, deliver jobs, messages
// claimed, deliveries by outcome) is what tells "running but stuck" from
// "idle".
type Metrics struct {
	deliveries         *prometheus.CounterVec
	deliveryDuration   *prometheus.HistogramVec
	claimed            prometheus.Counter
	deliverJobs        prometheus.Counter
	polls              prometheus.Counter
	wakeups            prometheus.Counter
	released           *prometheus.CounterVec
	relaysDeclaredDead prometheus.Counter
	stateChanges       *prometheus.CounterVec
	pruned             prometheus.Counter
}

// NewMetrics returns unregistered relay metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_deliveries_total",
			Help: "Delivery attempts by outcome: delivered, retry, failed, gone (410: endpoint paused), interrupted (cut off by a stop).",
		}, []string{"outcome"}),
		deliveryDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_delivery_duration_seconds",
			Help:    "Duration of webhook requests by outcome.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_claimed_total", Help: "Messages claimed for delivery.",
		}),
		deliverJobs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_deliver_jobs_total", Help: "Deliver jobs that took a destination's lease (one turn at serving it).",
		}),
		polls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_polls_total", Help: "Looks for destinations with due work: the relay's heartbeat, rising every poll interval even when idle.",
		}),
		wakeups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_wakeups_total", Help: "NOTIFYs received from committing transactions (OUTBOX_NOTIFY); each wakes the dispatch and the deliver jobs.",
		}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_claims_released_total",
			Help: "Claims returned to pending without an outcome, by reason: relay_dead (its relay stopped heartbeating), relay_stopped (left at a graceful stop), claim_timeout (the last resort).",
		}, []string{"reason"}),
		relaysDeclaredDead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relays_declared_dead_total", Help: "Relays this one declared dead (heartbeat silent past the relay timeout).",
		}),
		stateChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_destination_state_changes_total",
			Help: "Destinations entering a state, as this relay saw it happen: backing_off, healthy (recovered), paused (by a 410 Gone).",
		}, []string{"state"}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_pruned_total", Help: "Delivered and discarded messages deleted after the retention period.",
		}),
	}
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.deliveries, m.deliveryDuration, m.claimed, m.deliverJobs, m.polls,
		m.wakeups, m.released, m.relaysDeclaredDead, m.stateChanges, m.pruned} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// BacklogCollector reports the outbox's state from the tables themselves at
// each scrape: messages by status, the oldest pending age, how overdue the
// oldest deliverable message is, destinations by state and the relays
// alive. It reads the database, not process memory, so any process (api or
// worker) shows the truth, and a stalled relay is visible from outside it.
type BacklogCollector struct {
	pool         *pgxpool.Pool
	messages     *prometheus.Desc
	oldestAge    *prometheus.Desc
	overdue      *prometheus.Desc
	destinations *prometheus.Desc
	relays       *prometheus.Desc
	up           *prometheus.Desc
}

// NewBacklogCollector returns a collector reading from pool.
func NewBacklogCollector(pool *pgxpool.Pool) *BacklogCollector {
	return &BacklogCollector{
		pool: pool,
		messages: prometheus.NewDesc("outbox_messages",
			"Outbox messages by status (delivered history is not counted here).", []string{"status"}, nil),
		oldestAge: prometheus.NewDesc("outbox_oldest_pending_age_seconds",
			"Age of the oldest pending message; grows when the relay is stalled or a destination is down or paused.", nil, nil),
		overdue: prometheus.NewDesc("outbox_oldest_due_overdue_seconds",
			"How long the oldest deliverable message has waited past its due time (paused and backing-off destinations excluded); stays near the poll interval unless the relay is stalled or saturated.", nil, nil),
		destinations: prometheus.NewDesc("outbox_destinations",
			"Webhook endpoints by state: healthy, backing_off, paused.", []string{"state"}, nil),
		relays: prometheus.NewDesc("outbox_relays",
			"Relay processes registered and heartbeating.", nil, nil),
		up: prometheus.NewDesc("outbox_backlog_scrape_success",
			"1 when the backlog queries succeeded at this scrape.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.messages, c.oldestAge, c.overdue, c.destinations, c.relays, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var (
		b       outboxdb.MessageBacklogRow
		overdue float64
		states  outboxdb.EndpointStatesRow
		relays  int64
	)
	err := pgx.BeginTxFunc(ctx, c.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) (err error) {
		q := outboxdb.New(tx)
		if b, err = q.MessageBacklog(ctx); err != nil {
			return err
		}
		if overdue, err = q.MessageOverdue(ctx); err != nil {
			return err
		}
		if states, err = q.EndpointStates(ctx); err != nil {
			return err
		}
		relays, err = q.RelaysCount(ctx)
		return err
	})
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.up, 1)
	gauge(c.messages, float64(b.Pending), StatusPending)
	gauge(c.messages, float64(b.Claimed), StatusClaimed)
	gauge(c.messages, float64(b.Failed), StatusFailed)
	gauge(c.oldestAge, b.OldestPendingAgeSeconds)
	gauge(c.overdue, overdue)
	gauge(c.destinations, float64(states.Healthy), HealthHealthy)
	gauge(c.destinations, float64(states.BackingOff), HealthBackingOff)
	gauge(c.destinations, float64(states.Paused), HealthPaused)
	gauge(c.relays, float64(relays))
}
