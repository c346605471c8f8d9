package ops

import (
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Failed logins (a wrong token in the form or in a bearer header, on the
// ops page or the admin API) allowed per window, from one client address
// and from all of them together. Past either, every wrong token from the
// client (all clients, for the global one) is answered 429 until the window
// ends, without being compared or logged again. The right token always gets
// in: refusing it too would let anyone who can send 100 wrong tokens a
// minute (or 5 from behind the operator's own proxy) lock the operator out.
// The admin token is long and random, so the throttle is not what keeps it
// from being guessed; it keeps a guessing client from costing anything, and
// makes one show in the logs.
const (
	failuresPerAddr = 5
	failuresGlobal  = 100
	throttleWindow  = time.Minute
)

// throttle counts failed logins in fixed windows. It is in memory, per api
// process: with several processes a client may fail failuresPerAddr times
// at each, which the global limit still bounds.
type throttle struct {
	now    func() time.Time
	mu     sync.Mutex
	global window
	byAddr map[string]*window
}

// window is the failures counted since start.
type window struct {
	start time.Time
	n     int
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{now: now, byAddr: map[string]*window{}}
}

// wait is how long addr must wait before it may try to log in, 0 if it may
// now.
func (t *throttle) wait(addr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var d time.Duration
	if t.global.n >= failuresGlobal {
		d = t.global.start.Add(throttleWindow).Sub(now)
	}
	if w := t.byAddr[addr]; w != nil && w.n >= failuresPerAddr {
		d = max(d, w.start.Add(throttleWindow).Sub(now))
	}
	return max(d, 0)
}

// fail counts a failed login from addr.
func (t *throttle) fail(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	count := func(w *window) {
		if now.Sub(w.start) >= throttleWindow {
			*w = window{start: now}
		}
		w.n++
	}
	count(&t.global)
	w := t.byAddr[addr]
	if w == nil {
		// The global limit bounds how many addresses a window adds; the
		// ones whose window ended go as new ones come.
		for a, old := range t.byAddr {
			if now.Sub(old.start) >= throttleWindow {
				delete(t.byAddr, a)
			}
		}
		w = &window{start: now}
		t.byAddr[addr] = w
	}
	count(w)
}

// clientAddr is the address a request came from: the peer's IP, never a
// forwarded-for header, which any client can write; for IPv6 its /64, which
// one client holds whole. Behind a proxy every client shares the proxy's
// address, and so its limit.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.To4() != nil {
		return host
	}
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}

// renderThrottled answers a throttled login with 429 and when to come back.
func (h *Handler) renderThrottled(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	secs := int(math.Ceil(wait.Seconds()))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	l := h.layout(r, "Sign in")
	l.Authed = false
	h.render(w, r, http.StatusTooManyRequests, "login", loginPage{Layout: l,
		Error: "Too many failed sign-ins from here. Try again in " + strconv.Itoa(secs) + " seconds."})
}
