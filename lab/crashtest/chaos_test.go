package crashtest

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// proxyMode is what the chaos proxy does with one delivery.
type proxyMode int

const (
	forward         proxyMode = iota // pass it to the consumer and its answer back
	fail500                          // answer 500 without forwarding
	dropBefore                       // hijack and close without forwarding
	slowThenForward                  // wait past the delivery timeout, then forward: applied, but the relay gave up
	forwardThenDrop                  // forward, then close instead of answering: applied, answer lost
	numModes
)

var modeNames = [numModes]string{"forwarded", "500", "dropped before", "slow past timeout", "dropped after applying"}

// chaosProxy stands in front of the consumer as the webhook endpoint: a real
// HTTP server on 127.0.0.1 that, while chaos is on, answers 5xx, answers too
// late, or drops the connection before or after the consumer applied the
// event, and otherwise forwards. The "after" cases are the at-least-once
// window made to happen: the consumer has the event, the relay does not
// know, and it sends it again.
type chaosProxy struct {
	target   string        // the consumer's /webhooks URL
	slow     time.Duration // longer than the relay's delivery timeout
	srv      *http.Server
	url      string
	on       atomic.Bool
	inFlight atomic.Int64
	counts   [numModes]atomic.Int64
	client   *http.Client
	// conflicts counts the consumer's 409 answers (out of order: an
	// order.cancelled before its order.placed), whatever the mode did with
	// them: unlike the consumer's own counter, it survives a restart of the
	// consumer.
	conflicts atomic.Int64

	// applied records, per webhook-id (the event id: the proxy is one
	// endpoint, so one message per event), how each delivery the consumer
	// accepted was answered to the relay: so that each duplicate can be
	// put down to a lost answer or to the relay itself.
	appliedMu sync.Mutex
	applied   map[string][]bool // true: the 2xx reached the relay

	// journal, if set, gets a line per delivery, for a post-mortem.
	journal func(format string, args ...any)

	arrivalsMu sync.Mutex
	arrivals   []time.Time // when each request came
}

func newChaosProxy(t *testing.T, target string, slow time.Duration) *chaosProxy {
	t.Helper()
	p := &chaosProxy{target: target, slow: slow, client: &http.Client{Timeout: 10 * time.Second},
		applied: map[string][]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.url = "http://" + ln.Addr().String() + "/webhooks"
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

func (p *chaosProxy) pick() proxyMode {
	if !p.on.Load() {
		return forward
	}
	switch n := rand.IntN(100); {
	case n < 10:
		return fail500
	case n < 15:
		return dropBefore
	case n < 20:
		return slowThenForward
	case n < 25:
		return forwardThenDrop
	}
	return forward
}

func (p *chaosProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.arrivalsMu.Lock()
	p.arrivals = append(p.arrivals, time.Now())
	p.arrivalsMu.Unlock()
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	mode := p.pick()
	p.counts[mode].Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	switch mode {
	case fail500:
		http.Error(w, "chaos: internal error", http.StatusInternalServerError)
		return
	case dropBefore:
		drop(w)
		return
	case slowThenForward:
		// The relay gives up at its delivery timeout; the receiver carries on
		// regardless, as a slow real one would.
		time.Sleep(p.slow) // the injected slowness itself, not a wait for a condition
	}
	// A plain forward passes the relay's cancellation on, as a transparent
	// proxy would; the slow receiver carries on regardless.
	fwdCtx := r.Context()
	if mode == slowThenForward {
		fwdCtx = context.WithoutCancel(fwdCtx)
	}
	resp, err := p.send(fwdCtx, r, body)
	if err != nil {
		http.Error(w, "chaos proxy: consumer unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	if p.journal != nil {
		p.journal("delivery %s %s -> %d", r.Header.Get("webhook-id"), modeNames[mode], resp.status)
	}
	if resp.status == http.StatusConflict {
		p.conflicts.Add(1)
	}
	if resp.status/100 == 2 {
		answered := mode == forward && r.Context().Err() == nil // the relay is still listening
		p.appliedMu.Lock()
		id := r.Header.Get("webhook-id")
		p.applied[id] = append(p.applied[id], answered)
		p.appliedMu.Unlock()
	}
	if mode == forwardThenDrop {
		drop(w)
		return
	}
	for k, v := range resp.header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

type proxied struct {
	status int
	header http.Header
	body   []byte
}

// send forwards the delivery to the consumer.
func (p *chaosProxy) send(ctx context.Context, r *http.Request, body []byte) (proxied, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.target, bytes.NewReader(body))
	if err != nil {
		return proxied{}, err
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		return proxied{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return proxied{}, err
	}
	return proxied{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// drop closes the connection without an answer.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// duplicateCauses counts the deliveries the consumer received again after
// an earlier one it accepted, by how that earlier answer fared: lost (the
// proxy dropped it, or it came after the relay's delivery timeout) or
// received (the relay got its 2xx, and then died or lost its database
// connection before recording it).
func (p *chaosProxy) duplicateCauses() (afterLostAnswer, afterAnswer int) {
	p.appliedMu.Lock()
	defer p.appliedMu.Unlock()
	for _, answered := range p.applied {
		for _, a := range answered[:len(answered)-1] {
			if a {
				afterAnswer++
			} else {
				afterLostAnswer++
			}
		}
	}
	return afterLostAnswer, afterAnswer
}

// longestSilence is the longest time in [from, to] without a delivery
// attempt: with orders arriving steadily, a stall of the whole relay.
func (p *chaosProxy) longestSilence(from, to time.Time) time.Duration {
	p.arrivalsMu.Lock()
	defer p.arrivalsMu.Unlock()
	var longest time.Duration
	last := from
	for _, at := range p.arrivals {
		if at.Before(from) || at.After(to) {
			continue
		}
		longest = max(longest, at.Sub(last))
		last = at
	}
	return max(longest, to.Sub(last))
}

func (p *chaosProxy) summary() map[string]int64 {
	m := map[string]int64{}
	for i := range numModes {
		m[modeNames[i]] = p.counts[i].Load()
	}
	return m
}

// randDuration is uniform in [lo, hi).
func randDuration(lo, hi time.Duration) time.Duration {
	return lo + rand.N(hi-lo)
}

// every runs f at random intervals in [lo, hi) until ctx is done.
func every(ctx context.Context, wg *sync.WaitGroup, lo, hi time.Duration, f func()) {
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(randDuration(lo, hi)):
			}
			f()
		}
	})
}
