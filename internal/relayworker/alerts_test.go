package relayworker_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
)

// The alert rules docs/operations.md gives are valid rules, as Prometheus
// itself reads them (its rule file parser, which also parses each
// expression), and every metric they name is one a running api or worker
// exports: a rule on a metric renamed or never made
// would never fire. The metrics are read from the processes' /metrics,
// after a delivery and beside a poisoned message, so that each family has
// a series and its type (a histogram's _bucket, _sum and _count).
func TestTheDocumentedAlertRulesParseAndNameMetricsThatExist(t *testing.T) {
	t.Parallel()
	named := proctest.AlertRules(t, "Example Prometheus rules:") // metric: the alerts naming it
	alerts := map[string]bool{}
	for _, by := range named {
		for _, a := range by {
			alerts[a] = true
		}
	}
	for _, a := range []string{"OutboxDeliveryLate", "OutboxPoisonMessages"} {
		require.True(t, alerts[a], "the rules have %s", a)
	}
	_, err := proctest.Promrules("../..", "groups:\n- name: x\n  rules:\n  - alert: Broken\n    expr: sum(rate(x[5m]) > 1\n")
	require.Error(t, err, "the checker refuses a rule Prometheus would refuse")

	dbURL := dbtest.URL(t)
	rec := newReceiver(t)
	api := startAPI(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	worker := startWorker(t, map[string]string{"DATABASE_URL": dbURL, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	register(t, api, rec, "order.placed")
	code, body := api.call(t, http.MethodPost, "/orders", "",
		`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
	require.Equal(t, http.StatusCreated, code, "%s", body)
	require.Eventually(t, func() bool {
		var s stats
		code, err := api.tryAdmin(http.MethodGet, "/outbox/stats", "", &s)
		return err == nil && code == http.StatusOK && s.Delivered == 1
	}, 10*time.Second, 20*time.Millisecond)
	// A message that has spent 5 of its 9 attempts, its retry an hour
	// away: poisoned.
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), `INSERT INTO outbox_messages (event_id, type, destination, ordering_key, attempts, next_attempt_at)
		SELECT event_id, type, destination, 'poison', 5, now() + interval '1 hour' FROM outbox_messages`)
	require.NoError(t, err)

	exported := map[string]bool{}
	scrape := func(url, authz string) string {
		req, err := http.NewRequest(http.MethodGet, url+"/metrics", nil)
		require.NoError(t, err)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, url)
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return string(b)
	}
	// The worker's gauges are read every few seconds: wait for the poison.
	var workerText string
	require.Eventually(t, func() bool {
		workerText = scrape(worker.url, "")
		return strings.Contains(workerText, "outbox_poisoned_messages{")
	}, 20*time.Second, 100*time.Millisecond, "the worker reports the poisoned message")
	for _, text := range []string{workerText, scrape(api.url, "Bearer "+adminToken)} {
		tp := expfmt.NewTextParser(model.UTF8Validation)
		families, err := tp.TextToMetricFamilies(strings.NewReader(text))
		require.NoError(t, err)
		for name, f := range families {
			addFamily(exported, name, f.GetType())
		}
	}
	require.NotEmpty(t, named)
	for name, by := range named {
		require.True(t, exported[name], "%s (in %v) is exported by no process", name, by)
	}
}

// addFamily adds the series names of a metric family: a histogram's
// buckets, sum and count, a summary's sum and count, or its own name.
func addFamily(names map[string]bool, name string, typ dto.MetricType) {
	switch typ {
	case dto.MetricType_HISTOGRAM:
		names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
	case dto.MetricType_SUMMARY:
		names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
	default:
		names[name] = true
	}
}
