package relay

import (
	"sync"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
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
	partitionsDropped  prometheus.Counter
	// byEndpoint and byEndpointDuration are the delivery metrics by
	// endpoint id; nil when turned off.
	byEndpoint         *prometheus.CounterVec
	byEndpointDuration *prometheus.HistogramVec
	// deliveryLag is commit to delivery (or to failing), by kind and
	// outcome; byEndpointLag the same by endpoint, nil when turned off.
	deliveryLag   *prometheus.HistogramVec
	byEndpointLag *prometheus.HistogramVec

	// endpoints holds the ids byEndpoint has series for, so that the
	// series of deleted endpoints can be dropped (Relay.forgetDeleted)
	// rather than kept until the process restarts.
	endpointsMu sync.Mutex
	endpoints   map[uuid.UUID]struct{}
}

// sawEndpoint notes that id has series by endpoint. It is called after the
// series are updated: a sweep that drops them in between leaves id noted,
// and the next sweep drops what was added since.
func (m *Metrics) sawEndpoint(id uuid.UUID) {
	m.endpointsMu.Lock()
	defer m.endpointsMu.Unlock()
	if m.endpoints == nil {
		m.endpoints = map[uuid.UUID]struct{}{}
	}
	m.endpoints[id] = struct{}{}
}

// endpointIDs returns the ids with series by endpoint.
func (m *Metrics) endpointIDs() []uuid.UUID {
	m.endpointsMu.Lock()
	defer m.endpointsMu.Unlock()
	ids := make([]uuid.UUID, 0, len(m.endpoints))
	for id := range m.endpoints {
		ids = append(ids, id)
	}
	return ids
}

// forgetEndpoints drops every series by endpoint of ids.
func (m *Metrics) forgetEndpoints(ids []uuid.UUID) {
	m.endpointsMu.Lock()
	defer m.endpointsMu.Unlock()
	for _, id := range ids {
		labels := prometheus.Labels{"endpoint": id.String()}
		m.byEndpoint.DeletePartialMatch(labels)
		m.byEndpointDuration.DeletePartialMatch(labels)
		m.byEndpointLag.DeletePartialMatch(labels)
		delete(m.endpoints, id)
	}
}

// lagBuckets span a millisecond to a day: a delivery at once, one behind a
// poll, after a retry, after an outage.
var lagBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800,
	3600, 7200, 21600, 43200, 86400}

// MetricsOption changes what NewMetrics reports.
type MetricsOption func(*Metrics)

// WithoutEndpointMetrics leaves out the delivery metrics by endpoint. Their
// series are outcomes × endpoints (and the histogram's buckets on top):
// a few dozen per endpoint, which a service with thousands of endpoints
// may not want to pay. The metrics by outcome alone stay.
func WithoutEndpointMetrics() MetricsOption {
	return func(m *Metrics) { m.byEndpoint, m.byEndpointDuration, m.byEndpointLag = nil, nil, nil }
}

// NewMetrics returns unregistered relay metrics.
func NewMetrics(opts ...MetricsOption) *Metrics {
	m := &Metrics{
		byEndpoint: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_endpoint_deliveries_total",
			Help: "Delivery attempts by endpoint id and outcome (as outbox_deliveries_total).",
		}, []string{"endpoint", "outcome"}),
		byEndpointDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_endpoint_delivery_duration_seconds",
			Help:    "Duration of deliveries (a webhook request, a broker publish until its ack) by endpoint id and outcome.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"endpoint", "outcome"}),
		deliveryLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_delivery_lag_seconds",
			Help:    "From an event's writing (its commit, within its transaction's length) to its message's delivery (the receiver's 2xx, the broker's ack) or failure at the attempt cap, by destination kind and outcome (delivered, failed): the wait for retries, backoffs and pauses included.",
			Buckets: lagBuckets,
		}, []string{"kind", "outcome"}),
		byEndpointLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_endpoint_delivery_lag_seconds",
			Help:    "outbox_delivery_lag_seconds by endpoint id and outcome.",
			Buckets: lagBuckets,
		}, []string{"endpoint", "outcome"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_deliveries_total",
			Help: "Delivery requests by outcome. Attempts, as the history records them: delivered, retry, refused (a broker refused this message alone), failed, gone (410: endpoint paused), interrupted (cut off by a stop). Not attempts: throttled (429 or 503 without Retry-After to a request sent beside others: the relay's own burst; the message is due again with no attempt counted).",
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
			Help: "Lost claims released without an outcome, each an attempt that may have reached the receiver, by reason: relay_dead (its relay is not alive: killed, declared dead, or stopped with a claim it could not record), claim_timeout (older than its relay's claim timeout: the last resort).",
		}, []string{"reason"}),
		relaysDeclaredDead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_relays_declared_dead_total", Help: "Relays this one declared dead (heartbeat silent past the relay timeout).",
		}),
		stateChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_destination_state_changes_total",
			Help: "Destinations entering a state, as this relay saw it happen: backing_off, healthy (recovered), paused (by a 410 Gone).",
		}, []string{"state"}),
		partitionsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_partitions_dropped_total", Help: "Partitions of the outbox tables dropped once every message in them was settled and past its retention (each partition of events, messages and attempts together counts once).",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_pruned_total", Help: "Messages deleted one by one after their retention: delivered and discarded ones in partitions something keeps, and failed ones.",
		}),
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Register adds the metrics to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{m.deliveries, m.deliveryDuration, m.deliveryLag, m.claimed, m.deliverJobs, m.polls,
		m.wakeups, m.released, m.relaysDeclaredDead, m.stateChanges, m.pruned, m.partitionsDropped}
	if m.byEndpoint != nil {
		cs = append(cs, m.byEndpoint, m.byEndpointDuration, m.byEndpointLag)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
