package process

import (
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// HTTPMetrics counts and times the requests a server answers, by route: the
// ServeMux pattern that matched (`POST /orders/{id}/cancel`), never the raw
// path, so the number of series is bounded by the routes, not by the ids
// clients send.
type HTTPMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewHTTPMetrics returns unregistered HTTP server metrics.
func NewHTTPMetrics() *HTTPMetrics {
	return &HTTPMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "http_requests_total",
			Help: "Requests answered, by route pattern (unmatched: no route), method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "http_request_duration_seconds",
			Help:    "Time to answer a request, by route pattern and method.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
	}
}

// Collectors returns the metrics, to register.
func (m *HTTPMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.duration}
}

// Wrap measures every request h answers. h must be the ServeMux (or hold
// it without copying the request): the mux writes the pattern it matched
// into the request, which is where the route is read after it returns;
// nested muxes leave the innermost pattern.
func (m *HTTPMetrics) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		method := r.Method
		switch method {
		case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		default:
			method = "other" // a client's invention is not a label value
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		m.requests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
		m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// PoolCollector reports a pgxpool's connections and waits: a pool whose
// acquires wait (pgxpool_empty_acquires_total rising) is a process short of
// connections before its requests show it.
type PoolCollector struct {
	pool *pgxpool.Pool

	conns, maxConns, acquires, emptyAcquires, canceled, waited *prometheus.Desc
}

// NewPoolCollector returns a collector for pool, its metrics labelled with
// the pool's name (api, worker).
func NewPoolCollector(pool *pgxpool.Pool, name string) *PoolCollector {
	l := prometheus.Labels{"pool": name}
	return &PoolCollector{
		pool:          pool,
		conns:         prometheus.NewDesc("pgxpool_connections", "Connections by state: acquired (in use), idle, constructing.", []string{"state"}, l),
		maxConns:      prometheus.NewDesc("pgxpool_max_connections", "The pool's maximum size.", nil, l),
		acquires:      prometheus.NewDesc("pgxpool_acquires_total", "Connections acquired from the pool.", nil, l),
		emptyAcquires: prometheus.NewDesc("pgxpool_empty_acquires_total", "Acquires that found no idle connection and waited for one (or for a new one).", nil, l),
		canceled:      prometheus.NewDesc("pgxpool_canceled_acquires_total", "Acquires given up (their context ended) before a connection came.", nil, l),
		waited:        prometheus.NewDesc("pgxpool_acquire_wait_seconds_total", "Time spent acquiring connections, summed.", nil, l),
	}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.maxConns, c.acquires, c.emptyAcquires, c.canceled, c.waited} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the pool's counters in
// memory: no database query.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.AcquiredConns()), "acquired")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.IdleConns()), "idle")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.ConstructingConns()), "constructing")
	ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.emptyAcquires, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.canceled, prometheus.CounterValue, float64(s.CanceledAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, s.AcquireDuration().Seconds())
}
