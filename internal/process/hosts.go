package process

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/outboxkit/orders/internal/httpjson"
)

// Hosts are the host names a listener answers to besides those it always
// does (see CheckHost): lower case, without a port or a trailing dot.
type Hosts []string

// Hosts parses a comma-separated list of host names (api.example.com), the
// names clients reach the process by, as their Host header carries them
// without the port.
func (e *Env) Hosts(name string) Hosts {
	var hosts Hosts
	for v := range strings.SplitSeq(e.String(name, ""), ",") {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		h, err := hostName(v)
		if err != nil {
			e.Fail(name, fmt.Errorf("%q: %w", v, err))
			continue
		}
		hosts = append(hosts, h)
	}
	return hosts
}

// hostName checks one configured name and returns it as CheckHost compares
// it.
func hostName(v string) (string, error) {
	if strings.Contains(v, "://") || strings.ContainsAny(v, "/:@[]*") {
		return "", errors.New("want a host name such as api.example.com: no scheme, port, path or wildcard")
	}
	h := strings.TrimSuffix(strings.ToLower(v), ".")
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return "", errors.New("want a host name such as api.example.com (letters, digits, hyphens and dots)")
		}
	}
	return h, nil
}

// CheckHost answers 421 Misdirected Request, as a problem, to a request
// whose Host header names a host this process was not told it answers to,
// before h sees it. That is what a DNS rebinding looks like: a page from
// attacker.example whose name the attacker then points at this listener is
// same-origin with it in the browser, cookies and CORS notwithstanding,
// but its requests still carry Host: attacker.example.
//
// Always accepted, whatever allowed says: IP addresses (a browser sends one
// only for a page loaded from that address, which a rebinding cannot
// produce; probes and scrapers that reach the process by its address keep
// working), localhost (browsers resolve it to loopback themselves) and no
// Host at all (HTTP/1.0 health checks; a browser always sends one).
// setting names the variable that lists the other names, for the refusal.
func CheckHost(h http.Handler, setting string, allowed Hosts) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := requestHost(r.Host)
		if host == "" || host == "localhost" || slices.Contains(allowed, host) {
			h.ServeHTTP(w, r)
			return
		}
		if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
			h.ServeHTTP(w, r)
			return
		}
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusMisdirectedRequest,
			"this server does not answer to the host %q: it answers to its IP addresses, localhost and the names in %s", host, setting))
	})
}

// requestHost is the Host header's host, without its port or a trailing
// dot, in lower case.
func requestHost(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// LoopbackOnly reports whether addr (host:port) listens on loopback alone.
// An empty host, a host name other than localhost, or anything unparsable
// counts as beyond loopback: the check must fail safe.
func LoopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
