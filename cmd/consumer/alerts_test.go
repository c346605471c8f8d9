package main

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/consumer"
	"github.com/outboxkit/orders/internal/proctest"
)

// The consumer's alert rules in docs/operations.md parse as Prometheus
// reads them, and every metric they name is one the consumer exports (a
// histogram by its _bucket, _sum and _count series).
func TestTheDocumentedConsumerAlertRulesNameItsMetrics(t *testing.T) {
	t.Parallel()
	named := proctest.AlertRules(t, "its own metrics (`cmd/consumer/alerts_test.go`):")
	require.Contains(t, named, "consumer_event_lag_seconds_bucket")
	reg := prometheus.NewPedanticRegistry()
	for _, c := range consumer.New(nil, nil, slog.New(slog.DiscardHandler)).Collectors() {
		require.NoError(t, reg.Register(c))
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[f.GetName()+s] = true
			}
		}
	}
	for name, by := range named {
		require.True(t, exported[name], "%s (in %v) is not the consumer's", name, by)
	}
}
