package process_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/process"
)

// A listener answers to its IP addresses, localhost, no Host at all and
// the names it was given; any other Host, which is what a page whose name
// was rebound to the listener sends, is 421 before the handler runs.
func TestCheckHostRefusesNamesItWasNotGiven(t *testing.T) {
	t.Parallel()
	var reached bool
	h := process.CheckHost(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }),
		"API_ALLOWED_HOSTS", process.Hosts{"api.example.com"})
	for host, accepted := range map[string]bool{
		"127.0.0.1:8080":          true,
		"127.0.0.1":               true,
		"[::1]:8080":              true,
		"[::1]":                   true,
		"10.0.3.7:9090":           true,
		"localhost:8080":          true,
		"LOCALHOST.":              true,
		"":                        true,
		"api.example.com":         true,
		"API.Example.COM.:443":    true,
		"attacker.example:8080":   false,
		"attacker.example":        false,
		"localhost.attacker.test": false,
		"127.0.0.1.nip.io:8080":   false,
		"example.com":             false,
		"x.api.example.com":       false,
	} {
		reached = false
		req := httptest.NewRequest(http.MethodPost, "/webhook-endpoints", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, accepted, reached, "Host %q reaches the handler: %v", host, accepted)
		if accepted {
			continue
		}
		require.Equal(t, http.StatusMisdirectedRequest, rec.Code, "Host %q", host)
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
		var p struct{ Detail string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
		require.Contains(t, p.Detail, "API_ALLOWED_HOSTS", "the refusal names the setting that would let the host in")
	}
}

// Configured names are host names: a URL, a port or a wildcard is refused
// at start, naming the variable, rather than matching nothing.
func TestHostsAreHostNames(t *testing.T) {
	t.Parallel()
	parse := func(v string) (process.Hosts, error) {
		env := process.NewEnv(func(string) string { return v })
		hosts := env.Hosts("API_ALLOWED_HOSTS")
		return hosts, env.Err()
	}
	hosts, err := parse(" API.example.com., ops.internal ,,")
	require.NoError(t, err)
	require.Equal(t, process.Hosts{"api.example.com", "ops.internal"}, hosts, "lower case, without the trailing dot")
	for _, bad := range []string{"https://api.example.com", "api.example.com:8080", "*.example.com", "api..example.com", "api.example.com/x", "ex ample.com"} {
		_, err := parse(bad)
		require.ErrorContains(t, err, "API_ALLOWED_HOSTS", bad)
	}
}
