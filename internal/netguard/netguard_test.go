package netguard_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
)

func TestCheckAddr(t *testing.T) {
	t.Parallel()

	tests := []struct {
		addr         string
		allowed      bool // with the zero Guard
		allowPrivate bool // with AllowPrivate
		reason       string
	}{
		// Global unicast.
		{addr: "8.8.8.8", allowed: true, allowPrivate: true},
		{addr: "1.1.1.1", allowed: true, allowPrivate: true},
		{addr: "2606:4700::1111", allowed: true, allowPrivate: true},
		{addr: "2001:4860:4860::8888", allowed: true, allowPrivate: true},
		{addr: "::ffff:8.8.8.8", allowed: true, allowPrivate: true},
		{addr: "64:ff9b::808:808", allowed: true, allowPrivate: true}, // NAT64 of 8.8.8.8
		{addr: "2002:808:808::1", allowed: true, allowPrivate: true},  // 6to4 of 8.8.8.8
		{addr: "100.63.255.255", allowed: true, allowPrivate: true},   // just below CGNAT
		{addr: "100.128.0.0", allowed: true, allowPrivate: true},      // just above CGNAT
		{addr: "172.32.0.1", allowed: true, allowPrivate: true},       // just above 172.16/12
		{addr: "223.255.255.255", allowed: true, allowPrivate: true},  // just below multicast
		{addr: "169.253.255.255", allowed: true, allowPrivate: true},  // just below link-local
		{addr: "11.0.0.1", allowed: true, allowPrivate: true},         // just above 10/8
		{addr: "192.169.0.1", allowed: true, allowPrivate: true},      // just above 192.168/16
		{addr: "2a00:1450:4001:80b::200e", allowed: true, allowPrivate: true},

		// Non-global: refused by default, allowed with AllowPrivate.
		{addr: "127.0.0.1", allowPrivate: true, reason: "loopback"},
		{addr: "127.255.255.254", allowPrivate: true, reason: "loopback"},
		{addr: "::1", allowPrivate: true, reason: "loopback"},
		{addr: "::ffff:127.0.0.1", allowPrivate: true, reason: "loopback"},
		{addr: "10.1.2.3", allowPrivate: true, reason: "private"},
		{addr: "::ffff:10.1.2.3", allowPrivate: true, reason: "private"},
		{addr: "172.16.0.1", allowPrivate: true, reason: "private"},
		{addr: "172.31.255.255", allowPrivate: true, reason: "private"},
		{addr: "192.168.1.1", allowPrivate: true, reason: "private"},
		{addr: "100.64.0.1", allowPrivate: true, reason: "CGNAT"},
		{addr: "100.127.255.255", allowPrivate: true, reason: "CGNAT"},
		{addr: "192.0.0.8", allowPrivate: true, reason: "IETF"},
		{addr: "192.0.2.1", allowPrivate: true, reason: "documentation"},
		{addr: "198.18.0.1", allowPrivate: true, reason: "benchmarking"},
		{addr: "203.0.113.7", allowPrivate: true, reason: "documentation"},
		{addr: "fd12:3456:789a::1", allowPrivate: true, reason: "unique local"},
		{addr: "fc00::1", allowPrivate: true, reason: "unique local"},
		{addr: "fec0::1", allowPrivate: true, reason: "site-local"},
		{addr: "2001:db8::1", allowPrivate: true, reason: "documentation"},
		{addr: "2001::1", allowPrivate: true, reason: "IETF"}, // Teredo
		{addr: "100::1", allowPrivate: true, reason: "discard"},
		{addr: "64:ff9b::7f00:1", allowPrivate: true, reason: "NAT64 for 127.0.0.1"},
		{addr: "2002:a00:1::1", allowPrivate: true, reason: "6to4 for 10.0.0.1"},
		{addr: "::127.0.0.1", allowPrivate: true, reason: "outside IPv6 global unicast"}, // IPv4-compatible
		{addr: "4000::1", allowPrivate: true, reason: "outside IPv6 global unicast"},

		// Never allowed, not even with AllowPrivate.
		{addr: "169.254.169.254", reason: "metadata"},
		{addr: "::ffff:169.254.169.254", reason: "metadata"},
		{addr: "64:ff9b::a9fe:a9fe", reason: "NAT64 for 169.254.169.254, which is the cloud metadata"},
		{addr: "fd00:ec2::254", reason: "metadata"},
		{addr: "100.100.100.200", reason: "metadata"},                   // Alibaba Cloud
		{addr: "168.63.129.16", reason: "Azure WireServer"},             // a public address
		{addr: "192.0.0.192", reason: "metadata"},                       // Oracle Cloud, legacy
		{addr: "fd20:ce::254", reason: "metadata"},                      // GCP, IPv6-only instances
		{addr: "fd00:c1::a9fe:a9fe", reason: "metadata"},                // Oracle Cloud IPv6
		{addr: "fd00:ec2::253", reason: "AWS DNS"},                      // AWS Nitro
		{addr: "fd00:ec2::123", reason: "AWS time"},                     // AWS Nitro
		{addr: "64:ff9b::a83f:8110", reason: "NAT64 for 168.63.129.16"}, // WireServer through NAT64
		{addr: "::ffff:168.63.129.16", reason: "Azure WireServer"},      // and IPv4-mapped
		// The metadata address in the other forms that embed an IPv4
		// address, which a translating gateway would reach.
		{addr: "::a9fe:a9fe", reason: "an IPv6 form of 169.254.169.254, which is the cloud metadata"},        // IPv4-compatible
		{addr: "::ffff:0:a9fe:a9fe", reason: "an IPv6 form of 169.254.169.254, which is the cloud metadata"}, // IPv4-translated
		{addr: "64:ff9b:1::a9fe:a9fe", reason: "an IPv6 form of 169.254.169.254, which is the cloud metadata"},
		{addr: "::a83f:8110", reason: "Azure WireServer"},
		{addr: "169.254.0.1", reason: "link-local"},
		{addr: "fe80::1", reason: "link-local"},
		{addr: "fe80::1%eth0", reason: "link-local"},
		{addr: "0.0.0.0", reason: "this network"},
		{addr: "0.1.2.3", reason: "this network"},
		{addr: "::ffff:0.0.0.0", reason: "this network"},
		{addr: "::", reason: "unspecified"},
		{addr: "224.0.0.1", reason: "multicast"},
		{addr: "239.255.255.250", reason: "multicast"},
		{addr: "ff02::1", reason: "multicast"},
		{addr: "ff0e::1", reason: "multicast"},
		{addr: "255.255.255.255", reason: "broadcast"},
		{addr: "240.0.0.1", reason: "reserved"},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			t.Parallel()

			addr := netip.MustParseAddr(tt.addr)
			for _, g := range []struct {
				guard   netguard.Guard
				allowed bool
			}{
				{netguard.Guard{}, tt.allowed},
				{netguard.Guard{AllowPrivate: true}, tt.allowPrivate},
			} {
				err := g.guard.CheckAddr(addr)
				if g.allowed {
					require.NoError(t, err, "AllowPrivate=%v", g.guard.AllowPrivate)
					continue
				}
				require.ErrorIs(t, err, netguard.ErrForbiddenAddress, "AllowPrivate=%v", g.guard.AllowPrivate)
				require.ErrorContains(t, err, addr.String())
				require.ErrorContains(t, err, tt.reason)
			}
		})
	}
}

func TestCheckAddrInvalid(t *testing.T) {
	t.Parallel()

	for _, g := range []netguard.Guard{{}, {AllowPrivate: true}} {
		require.ErrorIs(t, g.CheckAddr(netip.Addr{}), netguard.ErrForbiddenAddress)
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()

	resolver := fakeResolver(t, map[string][]netip.Addr{
		"public.test":   {netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("2606:4700::1111")},
		"mixed.test":    {netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("10.0.0.1")},
		"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		"mapped.test":   {netip.MustParseAddr("::ffff:127.0.0.1")},
		"empty.test":    {},
	})

	tests := []struct {
		name         string
		url          string
		allowPrivate bool
		wantErr      error
		wantMsg      string
	}{
		{name: "public https IP", url: "https://8.8.8.8/hooks"},
		{name: "public http IP with port", url: "http://1.1.1.1:8080/hooks?x=1"},
		{name: "public IPv6 literal", url: "https://[2606:4700::1111]:8443/hooks"},
		{name: "uppercase scheme", url: "HTTPS://8.8.8.8/"},
		{name: "public name", url: "https://public.test/hooks"},
		{name: "public name with trailing dot", url: "https://public.test./hooks"},

		{name: "ftp scheme", url: "ftp://8.8.8.8/file", wantErr: netguard.ErrInvalidURL, wantMsg: `scheme "ftp"`},
		{name: "javascript scheme", url: "javascript:alert(1)", wantErr: netguard.ErrInvalidURL, wantMsg: `scheme "javascript"`},
		{name: "file scheme", url: "file:///etc/passwd", wantErr: netguard.ErrInvalidURL, wantMsg: `scheme "file"`},
		{name: "no scheme", url: "8.8.8.8/hooks", wantErr: netguard.ErrInvalidURL, wantMsg: "scheme"},
		{name: "empty", url: "", wantErr: netguard.ErrInvalidURL, wantMsg: "scheme"},
		{name: "missing host", url: "https:///hooks", wantErr: netguard.ErrInvalidURL, wantMsg: "missing host"},
		{name: "port without host", url: "https://:443/hooks", wantErr: netguard.ErrInvalidURL, wantMsg: "missing host"},
		{name: "opaque", url: "https:8.8.8.8", wantErr: netguard.ErrInvalidURL, wantMsg: "missing host"},
		{name: "userinfo", url: "https://user:pass@8.8.8.8/", wantErr: netguard.ErrInvalidURL, wantMsg: "userinfo"},
		{name: "username only", url: "https://8.8.8.8@127.0.0.1/", wantErr: netguard.ErrInvalidURL, wantMsg: "userinfo"},
		{name: "port zero", url: "https://8.8.8.8:0/", wantErr: netguard.ErrInvalidURL, wantMsg: "port"},
		{name: "port too large", url: "https://8.8.8.8:65536/", wantErr: netguard.ErrInvalidURL, wantMsg: "port"},
		{name: "unparsable", url: "http://[::1", wantErr: netguard.ErrInvalidURL},

		{name: "localhost", url: "http://localhost:1/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "loopback"},
		{name: "loopback IP", url: "http://127.0.0.1/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "loopback"},
		{name: "loopback IPv6", url: "http://[::1]/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "loopback"},
		{name: "mapped loopback literal", url: "http://[::ffff:127.0.0.1]/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "loopback"},
		{name: "metadata IP", url: "http://169.254.169.254/latest/meta-data/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "metadata"},
		{name: "zoned link-local", url: "http://[fe80::1%25eth0]/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "link-local"},
		{name: "any resolved address forbidden", url: "https://mixed.test/", wantErr: netguard.ErrForbiddenAddress, wantMsg: `"mixed.test"`},
		{name: "name resolving to metadata", url: "https://metadata.test/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "metadata"},
		{name: "name resolving to mapped loopback", url: "https://mapped.test/", wantErr: netguard.ErrForbiddenAddress, wantMsg: "loopback"},
		{name: "unresolvable name", url: "https://nxdomain.test/", wantErr: netguard.ErrUnresolvable, wantMsg: "does not resolve"},
		{name: "name without addresses", url: "https://empty.test/", wantErr: netguard.ErrUnresolvable, wantMsg: "does not resolve"},

		{name: "allow private: localhost", url: "http://localhost:1/", allowPrivate: true},
		{name: "allow private: loopback", url: "http://127.0.0.1:8080/", allowPrivate: true},
		{name: "allow private: mixed", url: "https://mixed.test/", allowPrivate: true},
		{name: "allow private: metadata still refused", url: "http://169.254.169.254/", allowPrivate: true, wantErr: netguard.ErrForbiddenAddress},
		{name: "allow private: scheme still checked", url: "ftp://127.0.0.1/", allowPrivate: true, wantErr: netguard.ErrInvalidURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			g := netguard.Guard{AllowPrivate: tt.allowPrivate, Resolver: resolver}
			err := g.CheckURL(t.Context(), tt.url)
			if tt.wantErr == nil && tt.wantMsg == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NotErrorIs(t, err, netguard.ErrForbiddenAddress)
				require.NotErrorIs(t, err, netguard.ErrInvalidURL)
			}
			require.ErrorContains(t, err, tt.wantMsg)
		})
	}
}

func TestControl(t *testing.T) {
	t.Parallel()

	tests := []struct {
		network      string
		address      string
		allowed      bool
		allowPrivate bool
	}{
		{network: "tcp4", address: "8.8.8.8:443", allowed: true, allowPrivate: true},
		{network: "tcp6", address: "[2606:4700::1111]:443", allowed: true, allowPrivate: true},
		{network: "tcp4", address: "127.0.0.1:8080", allowPrivate: true},
		{network: "tcp6", address: "[::1]:8080", allowPrivate: true},
		{network: "tcp6", address: "[::ffff:10.0.0.1]:80", allowPrivate: true},
		{network: "tcp4", address: "169.254.169.254:80"},
		{network: "tcp6", address: "[fe80::1%eth0]:80"},
		{network: "tcp", address: "example.com:80"},
		{network: "unix", address: "/var/run/docker.sock"},
		{network: "tcp", address: ""},
	}
	for _, tt := range tests {
		t.Run(tt.network+" "+tt.address, func(t *testing.T) {
			t.Parallel()

			for _, g := range []struct {
				guard   netguard.Guard
				allowed bool
			}{
				{netguard.Guard{}, tt.allowed},
				{netguard.Guard{AllowPrivate: true}, tt.allowPrivate},
			} {
				err := g.guard.Control(tt.network, tt.address, nil)
				if g.allowed {
					require.NoError(t, err, "AllowPrivate=%v", g.guard.AllowPrivate)
					continue
				}
				require.ErrorIs(t, err, netguard.ErrForbiddenAddress, "AllowPrivate=%v", g.guard.AllowPrivate)
			}
		})
	}
}

func TestTransportAndClientSettings(t *testing.T) {
	t.Parallel()

	tr := netguard.Guard{}.Transport()
	require.Nil(t, tr.Proxy, "an environment proxy would bypass the guard")
	require.NotNil(t, tr.DialContext)
	require.True(t, tr.ForceAttemptHTTP2)
	require.Equal(t, 1024, tr.MaxIdleConns)
	require.Equal(t, 256, tr.MaxIdleConnsPerHost)
	require.Positive(t, tr.TLSHandshakeTimeout)
	require.Positive(t, tr.IdleConnTimeout)
	require.Positive(t, tr.MaxResponseHeaderBytes)

	c := netguard.Guard{}.Client()
	require.Zero(t, c.Timeout)
	require.IsType(t, &http.Transport{}, c.Transport)
	require.ErrorIs(t, c.CheckRedirect(nil, nil), http.ErrUseLastResponse)
}

func newCountingServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestClientRefusesLoopbackAtConnectTime(t *testing.T) {
	t.Parallel()

	srv, hits := newCountingServer(t)

	_, err := netguard.Guard{}.Client().Get(srv.URL)
	require.ErrorIs(t, err, netguard.ErrForbiddenAddress)
	require.Zero(t, hits.Load(), "no request may reach the server")

	client := netguard.Guard{AllowPrivate: true}.Client()
	resp, err := client.Get(srv.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.EqualValues(t, 1, hits.Load())
}

// TestClientChecksResolvedAddress shows that the dial-time check sees the
// resolved IP, so a name that passed registration and later resolves to an
// internal address (DNS rebinding) is still refused.
func TestClientChecksResolvedAddress(t *testing.T) {
	t.Parallel()

	srv, hits := newCountingServer(t)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	resolver := fakeResolver(t, map[string][]netip.Addr{
		"rebind.test": {netip.MustParseAddr(u.Hostname())},
	})
	target := "http://rebind.test:" + u.Port() + "/"

	_, err = netguard.Guard{Resolver: resolver}.Client().Get(target)
	require.ErrorIs(t, err, netguard.ErrForbiddenAddress)
	require.Zero(t, hits.Load())

	resp, err := netguard.Guard{AllowPrivate: true, Resolver: resolver}.Client().Get(target)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.EqualValues(t, 1, hits.Load())
}

func TestClientDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name     string
		status   int
		location string
	}{
		{name: "found to same host", status: http.StatusFound, location: "/target"},
		{name: "permanent to same host", status: http.StatusPermanentRedirect, location: "/target"},
		{name: "see other to metadata", status: http.StatusSeeOther, location: "http://169.254.169.254/latest/meta-data/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			var targetHits atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc("/start", func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, tt.location, tt.status)
			})
			mux.HandleFunc("/target", func(w http.ResponseWriter, _ *http.Request) {
				targetHits.Add(1)
			})
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)

			resp, err := netguard.Guard{AllowPrivate: true}.Client().Post(srv.URL+"/start", "application/json", nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = resp.Body.Close() })
			_, _ = io.Copy(io.Discard, resp.Body)

			require.Equal(t, tt.status, resp.StatusCode)
			require.Equal(t, tt.location, resp.Header.Get("Location"))
			require.Zero(t, targetHits.Load())
		})
	}
}

func TestCheckURLHonoursContext(t *testing.T) {
	t.Parallel()

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	g := netguard.Guard{Resolver: fakeResolver(t, map[string][]netip.Addr{
		"public.test": {netip.MustParseAddr("8.8.8.8")},
	})}
	err := g.CheckURL(ctx, "https://public.test/")
	require.Error(t, err)
	require.True(t, errors.Is(err, context.Canceled), "got %v", err)
}

// A refusal's Reason is for the person who gave the URL: the problem
// alone, without the package's prefix or the action that found it, which
// Error keeps for a log; errors.Is still tells the kind.
func TestRefusalReasons(t *testing.T) {
	t.Parallel()
	for rawURL, want := range map[string]struct {
		kind   error
		reason string
	}{
		"ftp://1.1.1.1/hooks":      {netguard.ErrInvalidURL, `scheme "ftp" is not http or https`},
		"http://[::1":              {netguard.ErrInvalidURL, `missing ']' in host`},
		"https://u:p@1.1.1.1/":     {netguard.ErrInvalidURL, "userinfo is not allowed"},
		"https://1.1.1.1:0/":       {netguard.ErrInvalidURL, `invalid port "0"`},
		"http://169.254.169.254/":  {netguard.ErrForbiddenAddress, "169.254.169.254 is the cloud metadata service, which webhooks may not reach"},
		"http://[::ffff:10.0.0.1]": {netguard.ErrForbiddenAddress, "::ffff:10.0.0.1 is private, which webhooks may not reach"},
	} {
		err := netguard.Guard{}.CheckURL(context.Background(), rawURL)
		require.ErrorIs(t, err, want.kind, rawURL)
		var refused *netguard.RefusedError
		require.ErrorAs(t, err, &refused, rawURL)
		require.Equal(t, want.reason, refused.Reason(), rawURL)
		require.Contains(t, err.Error(), want.kind.Error()+": "+want.reason, "the log's text has both")
	}
}

// A refused host name's Reason says what was wrong with the name (it does
// not resolve, or resolves to an address webhooks may not reach) and
// nothing of the network the api runs in: not the DNS server it asked,
// which the resolver's error names, nor the addresses the name resolved
// to, which map the internal network for whoever registers names. Error,
// for the log, keeps both.
func TestRefusedNamesDoNotTellTheNetwork(t *testing.T) {
	t.Parallel()
	resolver := fakeResolver(t, map[string][]netip.Addr{
		"internal.test": {netip.MustParseAddr("10.20.30.40")},
		"mixed.test":    {netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("fd12:3456::7")},
		"mapped.test":   {netip.MustParseAddr("64:ff9b::a14:1e28")},
		"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		"empty.test":    {},
	})
	for rawURL, want := range map[string]struct {
		kind   error
		reason string
		logged string
	}{
		"https://internal.test/hooks": {netguard.ErrForbiddenAddress,
			`host "internal.test" resolves to an address that is not public, which webhooks may not reach`, "10.20.30.40"},
		"https://mixed.test/hooks": {netguard.ErrForbiddenAddress,
			`host "mixed.test" resolves to an address that is not public, which webhooks may not reach`, "fd12:3456::7"},
		"https://mapped.test/hooks": {netguard.ErrForbiddenAddress,
			`host "mapped.test" resolves to an address that is not public, which webhooks may not reach`, "10.20.30.40"},
		"https://metadata.test/hooks": {netguard.ErrForbiddenAddress,
			`host "metadata.test" resolves to an address that is not public, which webhooks may not reach`, "169.254.169.254"},
		"https://nxdomain.test/hooks": {netguard.ErrUnresolvable, `host "nxdomain.test" does not resolve`, "no such host"},
		// A name without records is a name that does not exist, to the resolver.
		"https://empty.test/hooks": {netguard.ErrUnresolvable, `host "empty.test" does not resolve`, "empty.test"},
	} {
		err := netguard.Guard{Resolver: resolver}.CheckURL(t.Context(), rawURL)
		require.ErrorIs(t, err, want.kind, rawURL)
		var refused *netguard.RefusedError
		require.ErrorAs(t, err, &refused, rawURL)
		require.Equal(t, want.reason, refused.Reason(), "%s: what was wrong with the name, and nothing of the network", rawURL)
		require.Contains(t, err.Error(), want.logged, "%s: the log's text keeps what the reason leaves out", rawURL)
	}
}
