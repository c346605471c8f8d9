package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Metrics are the relay's counters. Progress (claims run, messages claimed,
// deliveries by outcome) is what tells "running but stuck" from "idle".
type Metrics struct {
	deliveries       *prometheus.CounterVec
	deliveryDuration *prometheus.HistogramVec
	claimed          prometheus.Counter
	claimRuns        prometheus.Counter
	polls            prometheus.Counter
	released         prometheus.Counter
	pruned           prometheus.Counter
}

// NewMetrics returns unregistered relay metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_deliveries_total",
			Help: "Delivery attempts by outcome: delivered, retry, failed, gone, undeliverable.",
		}, []string{"outcome"}),
		deliveryDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_delivery_duration_seconds",
			Help:    "Duration of webhook requests by outcome.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"outcome"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_claimed_total", Help: "Messages claimed for delivery.",
		}),
		claimRuns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_claim_runs_total", Help: "Claim jobs run (one is started whenever a poll finds work).",
		}),
		polls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_polls_total", Help: "Looks for due work: the relay's heartbeat, rising every poll interval even when idle.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_stale_claims_released_total", Help: "Claims returned to pending after the claim timeout (a relay died).",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_pruned_total", Help: "Delivered messages deleted after the retention period.",
		}),
	}
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.deliveries, m.deliveryDuration, m.claimed, m.claimRuns, m.polls, m.released, m.pruned} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// BacklogCollector reports the outbox's state from the table itself at each
// scrape: pending, claimed and failed counts and the oldest pending age. It
// reads the database, not process memory, so any process (api or worker)
// shows the truth, and a stalled relay is visible from outside it.
type BacklogCollector struct {
	pool      *pgxpool.Pool
	messages  *prometheus.Desc
	oldestAge *prometheus.Desc
	overdue   *prometheus.Desc
	up        *prometheus.Desc
}

// NewBacklogCollector returns a collector reading from pool.
func NewBacklogCollector(pool *pgxpool.Pool) *BacklogCollector {
	return &BacklogCollector{
		pool: pool,
		messages: prometheus.NewDesc("outbox_messages",
			"Outbox messages by status (delivered history is not counted here).", []string{"status"}, nil),
		oldestAge: prometheus.NewDesc("outbox_oldest_pending_age_seconds",
			"Age of the oldest pending message; grows when the relay is stalled or a destination is down.", nil, nil),
		overdue: prometheus.NewDesc("outbox_oldest_due_overdue_seconds",
			"How long the oldest due pending message has waited past its due time; stays near the poll interval unless the relay is stalled or saturated.", nil, nil),
		up: prometheus.NewDesc("outbox_backlog_scrape_success",
			"1 when the backlog query succeeded at this scrape.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *BacklogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.messages
	ch <- c.oldestAge
	ch <- c.overdue
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *BacklogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	b, err := outboxdb.New(c.pool).MessageBacklog(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(b.Pending), StatusPending)
	ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(b.Claimed), StatusClaimed)
	ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(b.Failed), StatusFailed)
	ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, b.OldestPendingAgeSeconds)
	ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, b.OldestDueOverdueSeconds)
}
