package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/proctest"

	"github.com/outboxkit/orders/internal/dbtest"
)

// The README's run command: one process runs the api, the worker and the
// demo receiver; an order placed over HTTP arrives at the receiver, signed.
func TestDevRunsTheWholeService(t *testing.T) {
	t.Parallel()
	apiAddr, workerAddr, receiverAddr := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	env := map[string]string{
		"DATABASE_URL":         dbtest.URL(t),
		"API_ADDR":             apiAddr,
		"WORKER_ADDR":          workerAddr,
		"DEV_RECEIVER_ADDR":    receiverAddr,
		"LOG_FORMAT":           "json",
		"OUTBOX_POLL_INTERVAL": "50ms",
		"ADMIN_TOKEN":          "s3cret-admin-token",
	}
	var logs proctest.Output
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, &logs) }()

	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + apiAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "api ready")

	resp, err := http.Post("http://"+apiAddr+"/orders", "application/json",
		strings.NewReader(`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":2,"unit_price_cents":500}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), `"msg":"webhook received"`) &&
			strings.Contains(logs.String(), `"signature_valid":true`)
	}, 20*time.Second, 20*time.Millisecond, "the demo receiver logged the verified webhook")

	require.NotContains(t, logs.String(), "s3cret-admin-token", "a chosen admin token is never logged")
	require.Contains(t, logs.String(), `"admin_token":"(from ADMIN_TOKEN)"`)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not stop within 30s of SIGTERM")
	}
}
