package apiserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/secretbox"
)

// The api says at start, and the ops page on every page, when its session
// cookie will not be Secure although the page is reachable beyond this
// machine: the api serves no TLS itself, so only OPS_COOKIE_SECURE makes it
// Secure.
func TestWarnsWhenTheOpsCookieIsNotSecureBeyondLoopback(t *testing.T) {
	t.Parallel()
	keys, err := secretbox.Parse("k1:" + strings.Repeat("A", 43) + "=")
	require.NoError(t, err)
	tok := strings.Repeat("k", 32)
	cookie := func(c config) bool {
		for _, w := range c.warnings() {
			if strings.Contains(w, "OPS_COOKIE_SECURE") {
				return true
			}
		}
		return false
	}
	require.True(t, cookie(config{adminToken: tok, addr: "0.0.0.0:8080", secretKeys: keys}))
	require.True(t, cookie(config{adminToken: tok, addr: "127.0.0.1:8080", adminAddr: "10.0.0.5:9090", secretKeys: keys}))
	require.False(t, cookie(config{adminToken: tok, addr: "0.0.0.0:8080", opsCookieSecure: true, secretKeys: keys}), "set")
	require.False(t, cookie(config{adminToken: tok, addr: "127.0.0.1:8080", secretKeys: keys}), "on loopback only")
	require.False(t, cookie(config{addr: "0.0.0.0:8080", secretKeys: keys}), "no token: no ops page to sign in to")
}

// Beyond loopback clients reach the api by a name, which the Host check
// refuses until API_ALLOWED_HOSTS lists it: the api says so at start.
func TestWarnsWhenNamesAreRefusedBeyondLoopback(t *testing.T) {
	t.Parallel()
	keys, err := secretbox.Parse("k1:" + strings.Repeat("A", 43) + "=")
	require.NoError(t, err)
	names := func(c config) bool {
		for _, w := range c.warnings() {
			if strings.Contains(w, "API_ALLOWED_HOSTS") {
				return true
			}
		}
		return false
	}
	require.True(t, names(config{addr: "0.0.0.0:8080", secretKeys: keys}))
	require.True(t, names(config{addr: "127.0.0.1:8080", adminAddr: "10.0.0.5:9090", secretKeys: keys}), "the admin listener too")
	require.False(t, names(config{addr: "0.0.0.0:8080", allowedHosts: process.Hosts{"api.example.com"}, secretKeys: keys}), "set")
	require.False(t, names(config{addr: "127.0.0.1:8080", secretKeys: keys}), "on loopback, localhost and 127.0.0.1 are what clients use")
}
