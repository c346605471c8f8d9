package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/proctest"
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
		// A misspelling of a name the api and the worker both read.
		"OUTBOX_NOTIFI": "true",
	}
	var logs proctest.Output
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, proctest.Environ(env), &logs) }()

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

	// The README's addresses, by number and by localhost, pass the Host
	// check of the api's and the worker's listeners as they are.
	for _, addr := range []string{apiAddr, workerAddr} {
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		for _, base := range []string{"http://" + addr, "http://localhost:" + port} {
			req, err := http.NewRequest(http.MethodGet, base+"/metrics", nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer s3cret-admin-token")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, base)
		}
	}

	require.NotContains(t, logs.String(), "s3cret-admin-token", "a chosen admin token is never logged")
	require.Contains(t, logs.String(), `"admin_token":"(from ADMIN_TOKEN)"`)
	// The api and the worker both warn of a missing OUTBOX_SECRET_KEYS (and
	// of a misspelt name both read); in dev's one output, once is enough.
	require.Equal(t, 1, strings.Count(logs.String(), "OUTBOX_SECRET_KEYS is not set"),
		"each warning said once:\n%s", logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "OUTBOX_NOTIFI is set but nothing reads it"),
		"each warning said once:\n%s", logs.String())

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not stop within 30s of SIGTERM")
	}
}

// Each restart of dev keeps the demo receiver's endpoint: the same id (so
// its history does not read "deleted endpoint"), a new secret the new
// receiver verifies with, and every event type, even when an earlier run
// subscribed it to fewer.
func TestRestartKeepsTheDemoEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	addr := "127.0.0.1:8082"
	admin := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	// An earlier run's, from before a module added an event type.
	first, err := admin.CreateEndpoint(ctx, "http://"+addr+"/webhooks", events()[:1])
	require.NoError(t, err)

	var secrets []string
	for range 2 {
		_, err := registerReceiver(ctx, pool, addr, nil, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		eps, err := admin.Endpoints(ctx)
		require.NoError(t, err)
		require.Len(t, eps, 1, "one demo endpoint, however often dev restarts")
		require.Equal(t, first.ID, eps[0].ID, "the same endpoint, its history intact")
		require.Equal(t, slices.Sorted(slices.Values(events())), eps[0].EventTypes, "subscribed to every event")
		var secret string
		require.NoError(t, pool.QueryRow(ctx, `SELECT secret FROM webhook_endpoints WHERE id = $1`, first.ID).Scan(&secret))
		secrets = append(secrets, secret)
	}
	require.NotEqual(t, secrets[0], secrets[1], "each run signs with a secret of its own")
}

// The demo receiver hears every event of every module: a module that
// declares its Events (in its events.go, as new:event writes it) is listed
// in events(), or its events would reach nobody in development.
func TestDemoReceiverHearsEveryModule(t *testing.T) {
	t.Parallel()
	main, err := os.ReadFile("main.go")
	require.NoError(t, err)
	files, err := filepath.Glob("../../internal/*/events.go")
	require.NoError(t, err)
	declares := regexp.MustCompile(`(?m)^var Events = `)
	var modules []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if !declares.Match(b) {
			continue
		}
		pkg := filepath.Base(filepath.Dir(f))
		modules = append(modules, pkg)
		require.True(t, strings.Contains(string(main), pkg+".Events"),
			"cmd/dev's events() leaves out module %s: add %s.Events there (docs/adding-a-module.md)", pkg, pkg)
	}
	require.Contains(t, modules, "orders")
}
