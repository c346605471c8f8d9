// Package netguard keeps outbound webhook deliveries from reaching internal
// infrastructure (server-side request forgery). Webhook URLs are supplied by
// users, so without it anyone able to register an endpoint could make the
// relay call loopback services, the private network or cloud metadata APIs.
//
// The guard is applied twice: CheckURL gives a clear error when an endpoint
// is registered, and the dialer Control hook used by Transport and Client
// re-checks the actual IP at connect time, after DNS resolution, so DNS
// rebinding and redirects cannot get around a registration-time check.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"
	"time"
)

// ErrForbiddenAddress is the kind of a *RefusedError (with the address and
// the reason) for a target refused by policy, so callers can tell a policy
// refusal from a network failure with errors.Is, even through *url.Error
// and *net.OpError.
var ErrForbiddenAddress = errors.New("netguard: forbidden address")

// ErrInvalidURL is the kind of a *RefusedError (with the problem) from
// CheckURL when a webhook URL is malformed or uses a form the relay will not
// deliver to, so APIs can report it as a client error.
var ErrInvalidURL = errors.New("netguard: invalid webhook url")

// ErrUnresolvable is the kind of a *RefusedError from CheckURL for a host
// name that does not resolve, or resolves to no address: not a policy
// refusal, and not a malformed URL, but nothing a delivery could reach.
var ErrUnresolvable = errors.New("netguard: unresolvable host")

// RefusedError is a URL or an address the guard refuses. Its Error is for a
// log; its Reason says why in words for the person who gave the URL, without
// the package's prefix. errors.Is matches its kind: ErrInvalidURL,
// ErrForbiddenAddress or ErrUnresolvable.
type RefusedError struct {
	kind   error
	reason string
	// detail is what the log is told and the person who gave the URL is
	// not: the addresses a name resolved to, or the resolver's error, which
	// names the DNS server. Either maps the network the service runs in
	// for whoever can register names.
	detail string
}

func refused(kind error, format string, args ...any) *RefusedError {
	return &RefusedError{kind: kind, reason: fmt.Sprintf(format, args...)}
}

// Error is the kind, the reason and, in parentheses, the detail the reason
// leaves out: "netguard: invalid webhook url: scheme "ftp" is not http or
// https".
func (e *RefusedError) Error() string {
	if e.detail != "" {
		return e.kind.Error() + ": " + e.reason + " (" + e.detail + ")"
	}
	return e.kind.Error() + ": " + e.reason
}

// Unwrap is the kind, for errors.Is.
func (e *RefusedError) Unwrap() error { return e.kind }

// Reason is why, for the person who gave the URL: "scheme "ftp" is not
// http or https".
func (e *RefusedError) Reason() string { return e.reason }

// Guard decides which addresses outbound webhooks may reach. The zero value
// is the safe production policy: only globally routable unicast addresses.
type Guard struct {
	// AllowPrivate additionally permits loopback, private, shared (CGNAT),
	// unique-local and other non-global unicast ranges, for development,
	// tests and workshops where receivers run on the same host or LAN.
	// Link-local (which hosts cloud metadata services), known metadata
	// addresses, unspecified, multicast and broadcast addresses stay refused
	// because they are never legitimate webhook receivers.
	AllowPrivate bool
	// Resolver resolves host names in CheckURL and when dialing; nil means
	// net.DefaultResolver. It is configurable so tests can avoid real DNS.
	Resolver *net.Resolver
}

// Timeouts for the delivery transport. They bound the phases a context
// deadline would otherwise have to cover on its own, so a slow or malicious
// receiver cannot pin connections; the overall per-delivery deadline is left
// to the caller's context.
const (
	dialTimeout           = 10 * time.Second
	keepAlive             = 30 * time.Second
	tlsHandshakeTimeout   = 10 * time.Second
	idleConnTimeout       = 90 * time.Second
	expectContinueTimeout = time.Second
	maxResponseHeaderSize = 64 << 10
)

// CheckAddr reports whether one IP may be contacted (nil error). IPv4-mapped
// IPv6 addresses are judged as the IPv4 address they carry, and zones are
// ignored, so alternative spellings of a forbidden address stay forbidden.
func (g Guard) CheckAddr(addr netip.Addr) error {
	class, reason := classify(addr)
	switch {
	case class == classGlobal:
		return nil
	case class == classNonGlobal && g.AllowPrivate:
		return nil
	default:
		return refused(ErrForbiddenAddress, "%s is %s, which webhooks may not reach", addr, reason)
	}
}

// CheckURL validates a webhook URL at registration time so that users get an
// immediate, specific error instead of failed deliveries later. It refuses
// the URL if any address the host resolves to is forbidden, because the
// dialer may pick any of them. Passing does not make later deliveries safe on
// its own: DNS can change, which is why Client re-checks at connect time.
func (g Guard) CheckURL(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("parsing webhook url: %w", refused(ErrInvalidURL, "%s", urlReason(err)))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("checking webhook url: %w", refused(ErrInvalidURL, "scheme %q is not http or https", u.Scheme))
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("checking webhook url: %w", refused(ErrInvalidURL, "missing host"))
	}
	if u.User != nil {
		// Credentials in URLs leak into logs and admin UIs, and userinfo is
		// a classic trick to make a URL look like it points elsewhere.
		return fmt.Errorf("checking webhook url: %w", refused(ErrInvalidURL, "userinfo is not allowed"))
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("checking webhook url: %w", refused(ErrInvalidURL, "invalid port %q", port))
		}
	}

	host := u.Hostname()
	if addr, err := netip.ParseAddr(host); err == nil {
		if err := g.CheckAddr(addr); err != nil {
			return fmt.Errorf("checking webhook url host: %w", err)
		}
		return nil
	}

	addrs, err := g.resolver().LookupNetIP(ctx, "ip", host)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("resolving webhook url host %q: %w", host, err)
		}
		return fmt.Errorf("resolving webhook url host: %w", unresolvable(host, err))
	}
	if len(addrs) == 0 {
		return fmt.Errorf("resolving webhook url host: %w", refused(ErrUnresolvable, "host %q has no addresses", host))
	}
	for _, addr := range addrs {
		if err := g.CheckAddr(addr); err != nil {
			// The reason names the host the sender gave, not the address it
			// resolved to: that is the internal network's, for the log.
			r := refused(ErrForbiddenAddress, "host %q resolves to an address that is not public, which webhooks may not reach", host)
			r.detail = addrReason(err)
			return fmt.Errorf("checking webhook url host: %w", r)
		}
	}
	return nil
}

// addrReason is CheckAddr's refusal without its kind: "10.0.0.1 is
// private, which webhooks may not reach".
func addrReason(err error) string {
	var r *RefusedError
	if errors.As(err, &r) {
		return r.reason
	}
	return err.Error()
}

// unresolvable is the refusal of a host name whose lookup failed. The
// resolver's error names the DNS server it asked ("lookup x on
// 10.0.0.2:53: no such host"): it goes to the log, and the reason says only
// whether the name does not exist or the lookup failed.
func unresolvable(host string, err error) *RefusedError {
	r := refused(ErrUnresolvable, "host %q could not be resolved (the DNS lookup failed; try again)", host)
	if dnsErr := (*net.DNSError)(nil); errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		r = refused(ErrUnresolvable, "host %q does not resolve", host)
	}
	r.detail = err.Error()
	return r
}

// urlReason is a url.Parse error without the URL, which the person
// who gave it has in front of them.
func urlReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// Control is a net.Dialer Control function. The dialer calls it with the
// resolved IP just before connecting, which is the only point where the
// check cannot be raced by DNS changes. Anything that is not an IP:port
// (for example a Unix socket path) is refused, failing closed.
func (g Guard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("checking %s dial address %q: %w: not an IP address and port", network, address, ErrForbiddenAddress)
	}
	if err := g.CheckAddr(ap.Addr()); err != nil {
		return fmt.Errorf("checking %s dial address: %w", network, err)
	}
	return nil
}

// Transport returns an *http.Transport for webhook delivery. Every connection
// it opens passes through Control. Proxies are deliberately not taken from
// the environment: the proxy, not the relay, would then pick the final
// address and the guard would only ever see the proxy. Connection pools are
// sized for many concurrent deliveries to the same few receivers.
//
// Each call builds a new connection pool; create one per process and share it.
func (g Guard) Transport() *http.Transport {
	dialer := &net.Dialer{
		Timeout:   dialTimeout,
		KeepAlive: keepAlive,
		Resolver:  g.Resolver,
		Control:   g.Control,
	}
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        idleConnTimeout,
		TLSHandshakeTimeout:    tlsHandshakeTimeout,
		ExpectContinueTimeout:  expectContinueTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderSize,
	}
}

// Client returns an *http.Client for webhook delivery built on Transport.
// Redirects are returned to the caller rather than followed: a receiver must
// not be able to bounce a signed delivery to another host, and a 3xx from a
// webhook endpoint is a configuration error worth surfacing. There is no
// client-wide Timeout because callers bound each delivery with a context.
//
// Each call builds a new connection pool; create one per process and share it.
func (g Guard) Client() *http.Client {
	return &http.Client{
		Transport: g.Transport(),
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

func (g Guard) resolver() *net.Resolver {
	if g.Resolver != nil {
		return g.Resolver
	}
	return net.DefaultResolver
}
