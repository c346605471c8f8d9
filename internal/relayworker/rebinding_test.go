package relayworker_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
)

// The worker's listener has the api's Host check: a page whose name was
// rebound to a loopback worker (cmd/dev's) cannot read its /metrics, which
// name every endpoint, nor its probes; by address, localhost or a name in
// WORKER_ALLOWED_HOSTS they answer as before.
func TestWorkerRefusesReboundHosts(t *testing.T) {
	t.Parallel()
	worker := startWorker(t, map[string]string{"DATABASE_URL": dbtest.URL(t), "WORKER_ALLOWED_HOSTS": "worker-0.orders.test"})
	_, port, err := net.SplitHostPort(strings.TrimPrefix(worker.url, "http://"))
	require.NoError(t, err)
	request := func(path, host string) (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodGet, worker.url+path, nil)
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, body
	}
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		resp, body := request(path, "attacker.example:"+port)
		require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "%s by a rebound name: %s", path, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		var p struct{ Detail string }
		require.NoError(t, json.Unmarshal(body, &p))
		require.Contains(t, p.Detail, "WORKER_ALLOWED_HOSTS")
		for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "worker-0.orders.test:" + port} {
			resp, body = request(path, host)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s by %s: %s", path, host, body)
		}
	}
}
