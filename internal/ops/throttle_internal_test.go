package ops

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// A client is its IPv4 address, or its IPv6 /64, which one client holds
// whole: counting each of its addresses apart would give one client 2^64
// tries.
func TestClientAddrGroupsIPv6By64(t *testing.T) {
	t.Parallel()
	for remote, want := range map[string]string{
		"203.0.113.9:51234":                  "203.0.113.9",
		"[2001:db8:1:2:aaaa::1]:443":         "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:ffff:ffff:1]:80": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:80":               "2001:db8:1:3::/64",
		"[::ffff:203.0.113.9]:80":            "::ffff:203.0.113.9",
	} {
		require.Equal(t, want, clientAddr(&http.Request{RemoteAddr: remote}), remote)
	}
}
