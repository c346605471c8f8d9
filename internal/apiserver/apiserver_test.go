package apiserver_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOpsPageIsMountedBehindTheAdminToken(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"ADMIN_TOKEN": "tok"})
	for _, p := range []string{"/ops", "/ops/"} {
		code, body := s.do(t, http.MethodGet, p, "", "")
		require.Equal(t, http.StatusUnauthorized, code, p)
		require.Contains(t, string(body), `action="/ops/login"`)
		code, body = s.do(t, http.MethodGet, p, "Bearer tok", "")
		require.Equal(t, http.StatusOK, code, p)
		require.Contains(t, string(body), `id="pending-count"`)
	}
	code, body := s.do(t, http.MethodGet, "/ops/static/ops.css", "", "")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.Contains(string(body), ".kpi"))
}

func TestOpsPageWithoutAdminTokenIs403(t *testing.T) {
	t.Parallel()
	s := setup(t, nil)
	code, body := s.do(t, http.MethodGet, "/ops", "", "")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, string(body), "ADMIN_TOKEN")
	code, _ = s.do(t, http.MethodGet, "/outbox/stats", "", "")
	require.Equal(t, http.StatusForbidden, code, "like the other admin routes")
}
