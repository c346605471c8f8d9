package relayworker_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
	"github.com/outboxkit/orders/internal/relayworker"
)

const inClear = "OUTBOX_SECRET_KEYS is not set: webhook signing secrets are stored in the clear"

func newKeyEntry(t *testing.T, id string) (entry, material string) {
	t.Helper()
	raw := make([]byte, 32)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	material = base64.StdEncoding.EncodeToString(raw)
	return id + ":" + material, material
}

// storedSecrets returns every endpoint's stored secret.
func storedSecrets(t *testing.T, dbURL string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT secret FROM webhook_endpoints ORDER BY created_at")
	require.NoError(t, err)
	secrets, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return secrets
}

// An existing deployment turns encryption on: secrets written in the clear
// are sealed by `api reencrypt-secrets`, and an api and a worker with the
// key deliver to old and new endpoints alike, signed with the secrets the
// receivers were given.
func TestSecretKeysEndToEnd(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	entry, material := newKeyEntry(t, "k1")
	apiEnv := map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"}

	before := startAPI(t, apiEnv)
	require.Contains(t, before.logs.String(), inClear, "without a key the api says secrets are stored in the clear")
	oldRec := newReceiver(t)
	register(t, before, oldRec, "order.placed")
	require.NoError(t, before.stop())
	require.True(t, strings.HasPrefix(storedSecrets(t, dbURL)[0], "whsec_"), "written in the clear before a key was set")

	apiEnv["OUTBOX_SECRET_KEYS"] = entry
	var out proctest.Output
	require.NoError(t, apiserver.Run(context.Background(), []string{"reencrypt-secrets"}, proctest.Environ(apiEnv), &out))
	require.Contains(t, out.String(), `"endpoints_changed":1`, "the command reports what it changed")
	require.NotContains(t, out.String(), material, "the key is never logged")

	api := startAPI(t, apiEnv)
	newRec := newReceiver(t)
	register(t, api, newRec, "order.placed")
	workerEnv := relayEnv(dbURL)
	workerEnv["OUTBOX_SECRET_KEYS"] = entry
	worker := startWorker(t, workerEnv)
	for _, p := range []*proc{api, worker} {
		require.NotContains(t, p.logs.String(), inClear, "with a key nothing is said to be in the clear")
	}
	for _, s := range storedSecrets(t, dbURL) {
		require.True(t, strings.HasPrefix(s, "enc:v1:k1:"), "every stored secret is sealed, got %q", s)
	}

	code, body := api.call(t, http.MethodPost, "/orders", "",
		`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)
	for name, rec := range map[string]*receiver{"endpoint sealed by the command": oldRec, "endpoint sealed at creation": newRec} {
		require.Eventually(t, func() bool {
			delivered, _, bad := rec.snapshot()
			return len(delivered) == 1 || len(bad) > 0
		}, 30*time.Second, 20*time.Millisecond, "%s: the order's event never arrived", name)
		_, _, bad := rec.snapshot()
		require.Empty(t, bad, "%s: every delivery verifies with the secret returned at registration", name)
	}
	require.NotContains(t, worker.logs.String(), material, "the worker never logs the key")
}

func TestSecretKeysConfig(t *testing.T) {
	t.Parallel()
	t.Run("without a key the worker says so", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"DATABASE_URL": closedDB, "WORKER_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json"}
		var out proctest.Output
		err := relayworker.Run(context.Background(), nil, proctest.Environ(env), &out)
		require.ErrorContains(t, err, "connecting to database")
		require.Contains(t, out.String(), inClear)
		require.Contains(t, out.String(), `"level":"WARN"`, "it is a warning")
	})
	t.Run("a bad key names the variable, not the key", func(t *testing.T) {
		t.Parallel()
		raw := make([]byte, 16)
		material := base64.StdEncoding.EncodeToString(raw)
		env := map[string]string{"DATABASE_URL": closedDB, "OUTBOX_SECRET_KEYS": "k1:" + material}
		err := relayworker.Run(context.Background(), nil, proctest.Environ(env), io.Discard)
		require.ErrorContains(t, err, "OUTBOX_SECRET_KEYS")
		require.ErrorContains(t, err, "decodes to 16 bytes, want 32")
		require.NotContains(t, err.Error(), material)
	})
}
