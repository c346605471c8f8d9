package netguard_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
)

// registryBlock is one entry of IANA's IPv4 or IPv6 Special-Purpose Address
// Registry (RFC 6890), transcribed with its name, RFC and "Globally
// Reachable" column, and this guard's verdict on it.
type registryBlock struct {
	block  string
	name   string
	rfc    string
	global string // the registry's Globally Reachable column: True, False or N/A
	// privateOK: allowed with AllowPrivate. Every block is refused by the
	// default guard; the blocks refused even with AllowPrivate are those
	// that are never a receiver (unspecified, link-local, broadcast,
	// reserved) or, for the translation and mapping blocks, whose first and
	// last addresses embed such an IPv4 address.
	privateOK bool
	why       string
}

// ipv4Registry is the IPv4 Special-Purpose Address Registry
// (https://www.iana.org/assignments/iana-ipv4-special-registry/).
var ipv4Registry = []registryBlock{
	{"0.0.0.0/8", `"This network"`, "RFC 791, section 3.2", "False", false, "unspecified: never a destination"},
	{"0.0.0.0/32", `"This host on this network"`, "RFC 1122, section 3.2.1.3", "False", false, "unspecified: reaches the local host on some systems"},
	{"10.0.0.0/8", "Private-Use", "RFC 1918", "False", true, "private network"},
	{"100.64.0.0/10", "Shared Address Space", "RFC 6598", "False", true, "carrier-grade NAT, inside a provider"},
	{"127.0.0.0/8", "Loopback", "RFC 1122, section 3.2.1.3", "False", true, "the host itself"},
	{"169.254.0.0/16", "Link Local", "RFC 3927", "False", false, "hosts cloud metadata services"},
	{"172.16.0.0/12", "Private-Use", "RFC 1918", "False", true, "private network"},
	{"192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890, section 2.1", "False", true, "not global as a whole"},
	{"192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", "False", true, "DS-Lite tunnel endpoints"},
	{"192.0.0.8/32", "IPv4 dummy address", "RFC 7600", "False", true, "a placeholder source"},
	{"192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", "True", true, "global but anycast for a protocol: never a webhook receiver"},
	{"192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", "True", true, "global but anycast for a protocol: never a webhook receiver"},
	{"192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 section 2.2", "False", true, "a well-known name's answer, not a host"},
	{"192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880, RFC 7050 section 2.2", "False", true, "a well-known name's answer, not a host"},
	{"192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", "False", true, "documentation"},
	{"192.31.196.0/24", "AS112-v4", "RFC 7535", "True", true, "global but anycast DNS sinks: never a webhook receiver"},
	{"192.52.193.0/24", "AMT", "RFC 7450", "True", true, "global but anycast multicast relays: never a webhook receiver"},
	{"192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", "N/A", true, "deprecated anycast relays"},
	{"192.88.99.2/32", "6a44-relay anycast address", "RFC 6751", "False", true, "anycast relay"},
	{"192.168.0.0/16", "Private-Use", "RFC 1918", "False", true, "private network"},
	{"192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", "True", true, "global but anycast DNS sinks: never a webhook receiver"},
	{"198.18.0.0/15", "Benchmarking", "RFC 2544", "False", true, "lab networks"},
	{"198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", "False", true, "documentation"},
	{"203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", "False", true, "documentation"},
	{"240.0.0.0/4", "Reserved", "RFC 1112, section 4", "False", false, "not usable, and it ends at the broadcast address"},
	{"255.255.255.255/32", "Limited Broadcast", "RFC 8190, RFC 919 section 7", "False", false, "broadcast"},
}

// ipv6Registry is the IPv6 Special-Purpose Address Registry
// (https://www.iana.org/assignments/iana-ipv6-special-registry/).
var ipv6Registry = []registryBlock{
	{"::1/128", "Loopback Address", "RFC 4291", "False", true, "the host itself"},
	{"::/128", "Unspecified Address", "RFC 4291", "False", false, "unspecified"},
	{"::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", "False", false, "judged as the IPv4 address it carries; its ends carry 0.0.0.0 and 255.255.255.255"},
	{"64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", "True", false, "a NAT64 gateway reaches the embedded IPv4 address, which is judged; its ends embed 0.0.0.0 and 255.255.255.255"},
	{"64:ff9b:1::/48", "IPv4-IPv6 Translat.", "RFC 8215", "False", true, "local-use NAT64"},
	{"100::/64", "Discard-Only Address Block", "RFC 6666", "False", true, "blackhole"},
	{"100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", "False", true, "a placeholder"},
	{"2001::/23", "IETF Protocol Assignments", "RFC 2928", "False", true, "not global as a whole"},
	{"2001::/32", "TEREDO", "RFC 4380, RFC 8190", "N/A", true, "a tunnel whose server and client the address encodes"},
	{"2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", "True", true, "global but anycast for a protocol: never a webhook receiver"},
	{"2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", "True", true, "global but anycast for a protocol: never a webhook receiver"},
	{"2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "RFC 9665", "True", true, "global but anycast for a protocol: never a webhook receiver"},
	{"2001:2::/48", "Benchmarking", "RFC 5180, RFC Errata 1752", "False", true, "lab networks"},
	{"2001:3::/32", "AMT", "RFC 7450", "True", true, "global but anycast multicast relays: never a webhook receiver"},
	{"2001:4:112::/48", "AS112-v6", "RFC 7535", "True", true, "global but anycast DNS sinks: never a webhook receiver"},
	{"2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", "False", true, "identifiers, not locators"},
	{"2001:20::/28", "ORCHIDv2", "RFC 7343", "True", true, "global but identifiers, not locators: nothing listens there"},
	{"2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", "True", true, "global but identifiers, not locators: nothing listens there"},
	{"2001:db8::/32", "Documentation", "RFC 3849", "False", true, "documentation"},
	{"2002::/16", "6to4", "RFC 3056", "N/A", false, "a relay reaches the embedded IPv4 address, which is judged; its ends embed 0.0.0.0 and 255.255.255.255"},
	{"2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", "True", true, "global but anycast DNS sinks: never a webhook receiver"},
	{"3fff::/20", "Documentation", "RFC 9637", "False", true, "documentation"},
	{"5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", "False", true, "routing instructions, not hosts"},
	{"fc00::/7", "Unique-Local", "RFC 4193, RFC 8190", "False", true, "private network"},
	{"fe80::/10", "Link-Local Unicast", "RFC 4291", "False", false, "hosts cloud metadata services"},
}

// Every special-purpose block is refused by the default guard, at both of
// its ends: the registries mark most of them not globally reachable, and
// the few marked reachable hold anycast protocol services or identifiers,
// never a webhook receiver. A block added to a registry later is added here.
func TestSpecialPurposeRegistries(t *testing.T) {
	t.Parallel()
	for _, registry := range [][]registryBlock{ipv4Registry, ipv6Registry} {
		for _, b := range registry {
			prefix := netip.MustParsePrefix(b.block)
			require.Equal(t, prefix.Masked(), prefix, "%s is written as its network address", b.block)
			for _, addr := range []netip.Addr{prefix.Addr(), lastAddr(prefix)} {
				t.Run(b.block+"/"+addr.String(), func(t *testing.T) {
					t.Parallel()
					err := netguard.Guard{}.CheckAddr(addr)
					require.ErrorIs(t, err, netguard.ErrForbiddenAddress,
						"%s (%s, %s, globally reachable %s) must be refused by default: %s", addr, b.name, b.rfc, b.global, b.why)
					err = netguard.Guard{AllowPrivate: true}.CheckAddr(addr)
					if b.privateOK {
						require.NoError(t, err, "%s (%s) is allowed with AllowPrivate: %s", addr, b.name, b.why)
					} else {
						require.ErrorIs(t, err, netguard.ErrForbiddenAddress,
							"%s (%s) stays refused with AllowPrivate: %s", addr, b.name, b.why)
					}
				})
			}
		}
	}
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
