package netguard

import "net/netip"

// addrClass is the policy tier of an address.
type addrClass int

const (
	// classGlobal addresses are globally routable and always allowed.
	classGlobal addrClass = iota
	// classNonGlobal addresses are reachable only locally or within an
	// organisation; allowed only with Guard.AllowPrivate.
	classNonGlobal
	// classNever addresses are never valid webhook receivers, or expose
	// cloud credentials; refused even with Guard.AllowPrivate.
	classNever
)

type addrRange struct {
	prefix netip.Prefix
	reason string
}

// neverRanges are checked first so that an address inside a broader
// non-global range (metadata inside CGNAT or ULA) gets the stricter verdict.
// The cloud entries are the providers' documented instance-metadata and
// platform endpoints; most clouds use 169.254.169.254 (AWS, GCP's
// metadata.google.internal, Azure, DigitalOcean, OpenStack...), covered by
// link-local, but some sit in ranges that would otherwise pass.
var neverRanges = []addrRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "in the unspecified \"this network\" range"},
	{netip.MustParsePrefix("169.254.169.254/32"), "the cloud metadata service"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	// Alibaba Cloud's metadata service, inside CGNAT space.
	{netip.MustParsePrefix("100.100.100.200/32"), "the cloud metadata service"},
	// Azure's WireServer (VM agent, extensions, DNS), a public address
	// that answers only inside Azure.
	{netip.MustParsePrefix("168.63.129.16/32"), "the cloud platform service (Azure WireServer)"},
	// Oracle Cloud's legacy metadata address, inside 192.0.0.0/24.
	{netip.MustParsePrefix("192.0.0.192/32"), "the cloud metadata service"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "the broadcast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	// AWS Nitro's IPv6 metadata, DNS and time endpoints.
	{netip.MustParsePrefix("fd00:ec2::254/128"), "the cloud metadata service"},
	{netip.MustParsePrefix("fd00:ec2::253/128"), "the cloud platform service (AWS DNS)"},
	{netip.MustParsePrefix("fd00:ec2::123/128"), "the cloud platform service (AWS time)"},
	// GCP's metadata server for IPv6-only instances.
	{netip.MustParsePrefix("fd20:ce::254/128"), "the cloud metadata service"},
	// Oracle Cloud's IPv6 metadata endpoint (169.254.169.254 embedded).
	{netip.MustParsePrefix("fd00:c1::a9fe:a9fe/128"), "the cloud metadata service"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// nonGlobalRanges follow the IANA special-purpose address registries. Where
// the registry marks only part of a block as global, the whole block is
// treated as non-global: refusing an obscure address is cheaper than
// reaching an internal one. Blocks the registry marks globally reachable
// but that hold protocol anycast services (AS112, AMT, PCP, TURN) are
// refused too: they are infrastructure, never a webhook receiver.
var nonGlobalRanges = []addrRange{
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "in the shared (CGNAT) range"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved for IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "reserved for documentation"},
	{netip.MustParsePrefix("192.31.196.0/24"), "the AS112 anycast DNS service"},
	{netip.MustParsePrefix("192.52.193.0/24"), "the AMT anycast relay range"},
	{netip.MustParsePrefix("192.88.99.0/24"), "the deprecated 6to4 relay anycast range"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("192.175.48.0/24"), "the AS112 anycast DNS service"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved for benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "reserved for documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "reserved for documentation"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "in the local-use NAT64 range"},
	{netip.MustParsePrefix("100::/64"), "in the discard-only range"},
	{netip.MustParsePrefix("2001::/23"), "reserved for IETF protocol assignments"},
	{netip.MustParsePrefix("2001:db8::/32"), "reserved for documentation"},
	{netip.MustParsePrefix("2620:4f:8000::/48"), "the AS112 anycast DNS service"},
	{netip.MustParsePrefix("3fff::/20"), "reserved for documentation"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (private)"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
}

var (
	// nat64 and sixToFour embed an IPv4 address that a gateway will reach
	// on our behalf, so the embedded address is what must be judged.
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	// globalUnicast6 is the only IPv6 block currently allocated for global
	// unicast; anything outside it that is not listed above is not global.
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	// These carry an IPv4 address in their last 32 bits too: deprecated
	// IPv4-compatible addresses, SIIT's IPv4-translated ones and local-use
	// NAT64 (as a /96). They are not global anyway, but where a gateway
	// translates them they reach the embedded address, so one that embeds
	// a service never to be reached (the metadata service, link-local) is
	// refused even when private targets are allowed.
	embedsLast32 = []netip.Prefix{
		netip.MustParsePrefix("::/96"),
		netip.MustParsePrefix("::ffff:0:0:0/96"),
		netip.MustParsePrefix("64:ff9b:1::/48"),
	}
	// services are the never ranges where hosts answer (link-local, the
	// metadata service within it, the other clouds' metadata and platform
	// addresses), unlike broadcast or reserved space.
	services = []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("100.100.100.200/32"),
		netip.MustParsePrefix("168.63.129.16/32"),
		netip.MustParsePrefix("192.0.0.192/32"),
	}
)

// classify returns the policy tier of addr and, unless it is global, a
// human-readable reason suitable for an error message.
func classify(addr netip.Addr) (addrClass, string) {
	if !addr.IsValid() {
		return classNever, "not a valid IP address"
	}
	// Zoned addresses never match a prefix, and ::ffff:a.b.c.d must be
	// judged as a.b.c.d, otherwise both would slip past every range below.
	addr = addr.WithZone("").Unmap()

	for _, r := range neverRanges {
		if r.prefix.Contains(addr) {
			return classNever, r.reason
		}
	}
	if addr.Is6() {
		b := addr.As16()
		v4 := netip.AddrFrom4([4]byte(b[12:16]))
		for _, p := range embedsLast32 {
			if !p.Contains(addr) {
				continue
			}
			for _, svc := range services {
				if svc.Contains(v4) {
					_, reason := classify(v4)
					return classNever, "an IPv6 form of " + v4.String() + ", which is " + reason
				}
			}
		}
	}
	for _, r := range nonGlobalRanges {
		if r.prefix.Contains(addr) {
			return classNonGlobal, r.reason
		}
	}
	if addr.Is4() {
		return classGlobal, ""
	}

	b := addr.As16()
	switch {
	case nat64.Contains(addr):
		return classifyEmbedded(netip.AddrFrom4([4]byte(b[12:16])), "NAT64")
	case sixToFour.Contains(addr):
		return classifyEmbedded(netip.AddrFrom4([4]byte(b[2:6])), "6to4")
	case !globalUnicast6.Contains(addr):
		return classNonGlobal, "outside IPv6 global unicast space"
	}
	return classGlobal, ""
}

func classifyEmbedded(v4 netip.Addr, mechanism string) (addrClass, string) {
	class, reason := classify(v4)
	if class == classGlobal {
		return classGlobal, ""
	}
	return class, mechanism + " for " + v4.String() + ", which is " + reason
}
