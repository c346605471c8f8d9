package apiserver_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/dbtest"
)

// start runs the api on a fresh database until the test ends.
func start(t *testing.T, adminToken string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	env := map[string]string{"DATABASE_URL": dbtest.URL(t), "API_ADDR": addr, "ADMIN_TOKEN": adminToken, "LOG_FORMAT": "json"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- apiserver.Run(ctx, nil, func(k string) string { return env[k] }, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("api: %v", err)
		}
	})
	base := "http://" + addr
	require.Eventually(t, func() bool {
		res, err := http.Get(base + "/healthz")
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond)
	return base
}

func fetch(t *testing.T, url, bearer string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestOpsPageIsMountedBehindTheAdminToken(t *testing.T) {
	t.Parallel()
	base := start(t, "tok")
	for _, p := range []string{"/ops", "/ops/"} {
		code, body := fetch(t, base+p, "")
		require.Equal(t, http.StatusUnauthorized, code, p)
		require.Contains(t, body, `action="/ops/login"`)
		code, body = fetch(t, base+p, "tok")
		require.Equal(t, http.StatusOK, code, p)
		require.Contains(t, body, `id="pending-count"`)
	}
	code, body := fetch(t, base+"/ops/static/ops.css", "")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.Contains(body, ".kpi"))
}

func TestOpsPageWithoutAdminTokenIs403(t *testing.T) {
	t.Parallel()
	base := start(t, "")
	code, body := fetch(t, base+"/ops", "")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "ADMIN_TOKEN")
	code, _ = fetch(t, base+"/outbox/stats", "")
	require.Equal(t, http.StatusForbidden, code, "like the other admin routes")
}
