package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/proctest"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/webhook"
)

// closedDB is a well-formed URL nobody listens on.
const closedDB = "postgres://x@127.0.0.1:1/db"

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	good, err := webhook.NewSecret()
	require.NoError(t, err)
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"no database", map[string]string{"WEBHOOK_SECRETS": good}, []string{"DATABASE_URL"}},
		{"malformed database url", map[string]string{"DATABASE_URL": "postgres://%zz", "WEBHOOK_SECRETS": good}, []string{"DATABASE_URL"}},
		{"no secrets", map[string]string{"DATABASE_URL": closedDB}, []string{"WEBHOOK_SECRETS"}},
		{"only commas", map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": " , ,"}, []string{"WEBHOOK_SECRETS"}},
		{"a secret without its prefix", map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": good + ",c2VjcmV0"}, []string{"WEBHOOK_SECRETS", "secret 1"}},
		{"log format", map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": good, "LOG_FORMAT": "xml"}, []string{"LOG_FORMAT"}},
		{"inbox retention", map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": good, "CONSUMER_INBOX_RETENTION": "a month"},
			[]string{"CONSUMER_INBOX_RETENTION"}},
		{"inbox retention shorter than the retries", map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": good, "CONSUMER_INBOX_RETENTION": "1h"},
			[]string{"CONSUMER_INBOX_RETENTION", "at least 31h0m0s"}},
		{"inbox retention shorter than the jittered retries", map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": good, "CONSUMER_INBOX_RETENTION": "29h"},
			[]string{"CONSUMER_INBOX_RETENTION"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out proctest.Output
			err := run(context.Background(), nil, proctest.Environ(tc.env), &out)
			require.ErrorContains(t, err, "invalid configuration")
			for _, name := range tc.want {
				require.ErrorContains(t, err, name)
			}
			require.NotContains(t, err.Error(), good, "a secret must never be echoed")
			require.Empty(t, out.String())
		})
	}
	t.Run("valid config reaches the database", func(t *testing.T) {
		t.Parallel()
		err := run(context.Background(), nil, proctest.Environ(map[string]string{"DATABASE_URL": closedDB, "WEBHOOK_SECRETS": good}), io.Discard)
		require.ErrorContains(t, err, "connecting to database")
	})
	t.Run("arguments", func(t *testing.T) {
		t.Parallel()
		err := run(context.Background(), []string{"serve"}, proctest.Environ(nil), io.Discard)
		require.ErrorContains(t, err, "unexpected arguments")
	})
}

// The required inbox retention outlasts the sender's default retries at
// their longest: every wait of the schedule 10 % late (its jitter).
func TestMinInboxRetentionOutlastsTheSendersRetries(t *testing.T) {
	t.Parallel()
	var span time.Duration
	for _, d := range relay.DefaultRetrySchedule {
		span += d + d/10
	}
	require.Greater(t, minInboxRetention, span)
}

// TestServe runs the command against its own database and drives it over
// HTTP as the relay would: a delivery, its redelivery, a forgery.
func TestServe(t *testing.T) {
	t.Parallel()
	oldSecret, err := webhook.NewSecret()
	require.NoError(t, err)
	newSecret, err := webhook.NewSecret()
	require.NoError(t, err)
	addr := proctest.FreeAddr(t)
	env := map[string]string{
		"DATABASE_URL": dbtest.URL(t), "CONSUMER_ADDR": addr, "LOG_FORMAT": "json",
		"WEBHOOK_SECRETS": oldSecret + ", " + newSecret,
	}
	logs, stop := start(t, env)
	base := "http://" + addr
	id := uuid.NewString()
	body, err := json.Marshal(map[string]any{"id": id, "type": "order.placed", "created_at": time.Now().UTC(),
		"data": map[string]any{"id": uuid.NewString(), "customer_id": "c-1", "status": "placed", "total_cents": 1000,
			"lines": []map[string]any{{"sku": "A-1", "quantity": 2, "unit_price_cents": 500}}, "created_at": time.Now().UTC()}})
	require.NoError(t, err)
	deliver := func(secret string) int {
		req, err := http.NewRequest(http.MethodPost, base+"/webhooks", bytes.NewReader(body))
		require.NoError(t, err)
		signer, err := webhook.NewSigner(secret)
		require.NoError(t, err)
		signer.SetHeaders(req.Header, id, time.Now(), body)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, deliver(newSecret))
	require.Equal(t, http.StatusOK, deliver(oldSecret), "the redelivery, signed with the other secret")
	forger, err := webhook.NewSecret()
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, deliver(forger))

	resp, err := http.Get(base + "/stats")
	require.NoError(t, err)
	var stats map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	resp.Body.Close()
	require.EqualValues(t, 1, stats["applied"])
	require.EqualValues(t, 1, stats["duplicates"])
	require.EqualValues(t, 1, stats["bad_signature"])
	require.EqualValues(t, 1, stats["inbox_total"])
	require.EqualValues(t, 1, stats["ledger_total"])

	resp, err = http.Get(base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `consumer_webhooks_total{outcome="duplicate"} 1`)

	require.NoError(t, stop())
	for _, s := range []string{oldSecret, newSecret} {
		require.NotContains(t, logs.String(), s, "a secret was logged")
		require.NotContains(t, logs.String(), strings.TrimPrefix(s, webhook.SecretPrefix))
	}
	require.Contains(t, logs.String(), "webhook rejected", "the forgery is logged, without secrets")

	// A restart finds its schema and its inbox in place; counters restart.
	_, stop = start(t, env)
	resp, err = http.Get(base + "/stats")
	require.NoError(t, err)
	stats = nil
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	resp.Body.Close()
	require.EqualValues(t, 1, stats["inbox_total"])
	require.EqualValues(t, 0, stats["applied"])
	require.NoError(t, stop())
}

// start runs the command in-process until stop, which cancels it (as
// SIGTERM does) and returns its result; it waits until /readyz answers.
func start(t *testing.T, env map[string]string) (*proctest.Output, func() error) {
	t.Helper()
	logs := &proctest.Output{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, proctest.Environ(env), logs) }()
	var once sync.Once
	var result error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(20 * time.Second):
				result = errors.New("did not stop within 20s")
			}
		})
		return result
	}
	t.Cleanup(func() { _ = stop() })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + env["CONSUMER_ADDR"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "never ready; logs:\n%s", logs.String())
	return logs, stop
}
