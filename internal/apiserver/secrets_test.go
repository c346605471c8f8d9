package apiserver_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
)

const inClear = "OUTBOX_SECRET_KEYS is not set: webhook signing secrets are stored in the clear"

func keyEntry(t *testing.T) string {
	t.Helper()
	raw := make([]byte, 32)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	return "k1:" + base64.StdEncoding.EncodeToString(raw)
}

// Without a key the api says at start, and the ops page on every page, that
// signing secrets are stored in the clear; with one, neither.
func TestSecretsInTheClearAreSaid(t *testing.T) {
	t.Parallel()
	for _, keys := range []string{"", keyEntry(t)} {
		s := setup(t, map[string]string{"ADMIN_TOKEN": adminToken, "OUTBOX_SECRET_KEYS": keys})
		code, page := s.do(t, http.MethodGet, "/ops", "Bearer "+adminToken, "")
		require.Equal(t, http.StatusOK, code)
		if keys == "" {
			require.Contains(t, s.logs.String(), inClear, "the api warns at start")
			require.Contains(t, string(page), inClear, "the ops page shows the warning")
		} else {
			require.NotContains(t, s.logs.String(), inClear, "with a key there is nothing to warn of")
			require.NotContains(t, string(page), inClear)
		}
		require.NoError(t, s.stop())
	}
}

func TestReencryptSecretsCommand(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	run := func(keys string, args ...string) (string, error) {
		var out proctest.Output
		env := map[string]string{"DATABASE_URL": dbURL, "LOG_FORMAT": "json", "OUTBOX_SECRET_KEYS": keys}
		err := apiserver.Run(context.Background(), args, proctest.Environ(env), &out)
		return out.String(), err
	}
	_, err := run("", "reencrypt-secrets")
	require.ErrorContains(t, err, "OUTBOX_SECRET_KEYS is not set", "without a key there is nothing to encrypt with")

	out, err := run(keyEntry(t), "reencrypt-secrets")
	require.NoError(t, err)
	require.Contains(t, out, `"endpoints_changed":0`, "an empty table: nothing changed, and said")

	_, err = run("", "reencrypt-secrets", "now")
	require.ErrorContains(t, err, "unknown command")

	err = apiserver.Run(context.Background(), nil,
		proctest.Environ(map[string]string{"DATABASE_URL": closedDB, "OUTBOX_SECRET_KEYS": "k1:short"}), io.Discard)
	require.ErrorContains(t, err, "OUTBOX_SECRET_KEYS", "a bad key ring names the variable")
}
