package relay

import (
	"time"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// A destination's health and pace, as one deliver job sees it: whether it
// may be sent to, how many requests may be in flight, and what each answer
// changes. Plain Go, no database: the session asks it before each claim,
// tells it every answer, and stores what it became when the job ends
// (DestinationSettle).
//
// The pace is TCP's congestion window, for requests instead of packets.
// It starts low (startWindow) for a destination never served or coming
// back from an outage, doubles per window of successes (slow start) up to
// where it was last cut, then grows by one per window (additive increase),
// and is halved when the receiver says it is full: a 429 or 503 without
// Retry-After, a timeout, a refused connection (multiplicative decrease).
// Additive increase and multiplicative decrease is the one rule known to
// converge to a fair share of a receiver's capacity whatever the start,
// and needs nothing from the receiver but its refusals; a latency-based
// limiter (Vegas, Gradient) would also need a baseline latency per
// destination, which a webhook receiver's own work makes noisy. A cut
// applies once per window: the answers to requests sent before it are the
// same burst, and do not cut again. OUTBOX_DESTINATION_CONCURRENCY is the
// ceiling.
//
// A refusal the relay provoked is not the message's failure: a 429 or 503
// without Retry-After for a request sent while others were in flight to
// the destination is the receiver's worker pool being full of the relay's
// own requests. That message goes back to pending without an attempt
// (throttled) and the window is cut; only a refusal of a request sent
// alone counts against the message and the destination. So a receiver
// that can take the load, but refuses excess concurrency, is never sent
// down the day-long retry schedule by the relay's own burst.

// state is a destination's health as a job sees it.
type state int

const (
	// stateSending: requests go out, as many at once as the window allows.
	stateSending state = iota
	// stateProbing: the destination was backing off as a whole. One
	// request at a time until one gets an answer (then sending, from a low
	// window) or fails (then tripped).
	stateProbing
	// stateTripped: endpoint-wide failures in a row reached the threshold,
	// or a probe failed. Nothing more is sent; the destination backs off
	// as a whole until its next probe.
	stateTripped
	// stateHeld: the receiver asked the whole destination to wait (429 or
	// 503 with Retry-After). Nothing more is sent until then.
	stateHeld
	// stateGone: the receiver answered 410 Gone. The endpoint is paused.
	stateGone
)

// signal is what one answer says about the destination as a whole.
type signal int

const (
	// signalNone says nothing: a request cut off by a stop, or a message
	// refused by a broker's client before it reached the broker.
	signalNone signal = iota
	// signalUp: the receiver answered, delivered or refusing this message
	// alone (400, 422, …): it is reachable.
	signalUp
	// signalFull: 429 or 503 without Retry-After: the receiver is full.
	signalFull
	// signalSlow: no answer within the delivery timeout.
	signalSlow
	// signalRefused: the connection was refused or reset, or could not be
	// made.
	signalRefused
	// signalDown: an answer that says the destination as a whole is in
	// trouble (5xx but 503, 401, 403, 404, 405, 408; see endpointWide).
	signalDown
	// signalWait: 429 or 503 with Retry-After: wait as told.
	signalWait
	// signalGone: 410 Gone.
	signalGone
)

// startWindow is the window of a destination never served, or coming back
// from an outage: two requests, so the first answers come back while the
// next are on their way.
const startWindow = 2

// pace is one destination's health and window, for one deliver job.
type pace struct {
	state state
	// window is how many requests may be in flight while sending;
	// threshold is where slow start ends (the window's last cut).
	window, threshold float64
	// ceiling is the most requests ever in flight
	// (OUTBOX_DESTINATION_CONCURRENCY).
	ceiling int
	// failures counts endpoint-wide failures in a row; trip is the
	// circuit's threshold (OUTBOX_CIRCUIT_THRESHOLD).
	failures, trip int
	// lastFailure says the latest of them.
	lastFailure string
	// sent numbers the requests (seq); cutAt is the number of the latest
	// one sent when the window was last cut.
	sent, cutAt uint64
	// heldUntil is the end of a Retry-After, on the database's clock.
	heldUntil time.Time
	// probed: a probe was answered or failed (while probing); probing:
	// the job began by probing.
	probed, probing bool
	// backoffUntil and backoffReason are the destination's stored backoff,
	// kept when a probing job makes no probe.
	backoffUntil  *time.Time
	backoffReason *string
}

// newPace is the pace a job starts with: probing a destination that is
// backing off, else sending from the window the last job left (remembered,
// nil when not known: startWindow).
func newPace(cfg Config, lease outboxdb.DestinationLeaseRow) *pace {
	p := &pace{ceiling: cfg.DestinationConcurrency, trip: cfg.CircuitThreshold, failures: int(lease.ConsecutiveFailures),
		window: startWindow, threshold: float64(cfg.DestinationConcurrency),
		backoffUntil: lease.BackoffUntil, backoffReason: lease.HealthReason}
	if lease.Health == outbox.HealthBackingOff {
		p.state, p.probing = stateProbing, true
	}
	remembered := lease.Pace
	if remembered != nil {
		p.window = float64(*remembered)
	}
	p.window = min(p.window, float64(p.ceiling))
	return p
}

// room is how many more requests may start now, with inFlight in flight.
func (p *pace) room(inFlight int) int {
	switch p.state {
	case stateSending:
		return max(0, min(int(p.window), p.ceiling)-inFlight)
	case stateProbing:
		if p.probed {
			return 0
		}
		return max(0, 1-inFlight)
	default:
		return 0
	}
}

// sending says whether anything more may be sent in this job.
func (p *pace) sending() bool { return p.state == stateSending || p.state == stateProbing && !p.probed }

// send numbers a request as it starts.
func (p *pace) send() (seq uint64) {
	p.sent++
	return p.sent
}

// answer takes what one request's answer says: sig, for the request
// numbered seq, sent while concurrent requests (itself included) were in
// flight to the destination; retryUntil is a Retry-After's end, reason the
// failure in words. It returns whether the answer is a throttle: a refusal
// the relay's own concurrency provoked, not to count against the message.
// A request was alone when nothing else was in flight as it started and
// nothing else started before its answer came.
func (p *pace) answer(sig signal, seq uint64, concurrent int, retryUntil time.Time, reason string) (throttled bool) {
	switch sig {
	case signalNone:
		return false
	case signalUp:
		p.failures = 0
		if p.state == stateProbing {
			p.state, p.probed = stateSending, true
			p.window, p.threshold = min(startWindow, float64(p.ceiling)), float64(p.ceiling)
			return false
		}
		p.grow()
		return false
	case signalGone:
		p.state = stateGone
		return false
	case signalFull:
		p.cut(seq)
		alone := concurrent <= 1 && p.sent == seq
		if !alone && p.state == stateSending {
			return true
		}
	case signalSlow, signalRefused:
		p.cut(seq)
	case signalWait:
		if p.state != stateGone && retryUntil.After(p.heldUntil) {
			p.heldUntil = retryUntil
		}
	}
	p.fail(reason)
	if sig == signalWait && p.state == stateSending {
		p.state = stateHeld
	}
	return false
}

// fail counts an endpoint-wide failure: a failed probe, or the threshold's
// worth in a row, trips the circuit.
func (p *pace) fail(reason string) {
	p.failures++
	p.lastFailure = reason
	switch p.state {
	case stateProbing:
		p.state, p.probed = stateTripped, true
	case stateSending, stateHeld:
		if p.failures >= p.trip {
			p.state = stateTripped
		}
	}
}

// grow widens the window after a success: by one per success below the
// threshold (doubling per window), by one per window above it.
func (p *pace) grow() {
	if p.window < p.threshold {
		p.window++
	} else {
		p.window += 1 / p.window
	}
	p.window = min(p.window, float64(p.ceiling))
}

// cut halves the window, once per window: the answer to a request sent
// before the last cut is of the same burst.
func (p *pace) cut(seq uint64) {
	if seq <= p.cutAt {
		return
	}
	p.threshold = max(p.window/2, 1)
	p.window = p.threshold
	p.cutAt = p.sent
}

// verdict is the destination's health as the job leaves it, on the
// database's clock now: backing off after a trip (then backoffUntil is the
// next probe: 5 s after it started backing off, doubling with each failed
// probe), else healthy (then backoffUntil is the end of a Retry-After, if
// the receiver sent one). A probing job that made no probe (nothing was
// due) changes nothing. failures is the streak to store.
func (p *pace) verdict(now time.Time, cfg Config) (health string, backoffUntil *time.Time, reason *string, failures int) {
	switch {
	case p.state == stateProbing && !p.probed:
		return outbox.HealthBackingOff, p.backoffUntil, p.backoffReason, p.failures
	case p.state == stateTripped:
		if !p.probing {
			// It starts backing off now. The streak is stored as the
			// threshold, so each failed probe after this adds one and
			// doubles the wait before the next.
			p.failures = p.trip
		}
		until := now.Add(cfg.probeDelay(p.failures - p.trip))
		if p.heldUntil.After(until) {
			until = p.heldUntil
		}
		why := truncate(p.lastFailure, 500)
		return outbox.HealthBackingOff, &until, &why, p.failures
	case !p.heldUntil.IsZero():
		until := p.heldUntil
		return outbox.HealthHealthy, &until, nil, p.failures
	}
	return outbox.HealthHealthy, nil, nil, p.failures
}

// remembered is the window the next job may start from: nil when the
// destination starts over (backing off, paused, or only probed).
func (p *pace) remembered() *int32 {
	if p.state != stateSending && p.state != stateHeld {
		return nil
	}
	w := int32(max(1, int(p.window)))
	return &w
}
