package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// The pace is plain Go: these tests drive it with answers, no database.

func sendingPace(window int32) *pace {
	return newPace(DefaultConfig(), outboxdb.DestinationLeaseRow{Health: outbox.HealthHealthy, Pace: &window})
}

// A destination never served starts at two requests, doubles per window of
// successes up to the ceiling, and a remembered pace is where the next job
// starts.
func TestAPaceStartsLowAndGrowsWhileRequestsSucceed(t *testing.T) {
	t.Parallel()
	p := newPace(DefaultConfig(), outboxdb.DestinationLeaseRow{Health: outbox.HealthHealthy})
	require.Equal(t, startWindow, p.room(0), "a new destination starts low")
	windows := []int{p.room(0)}
	for len(windows) < 6 {
		n := p.room(0)
		for range n {
			require.False(t, p.answer(signalUp, p.send(), n, time.Time{}, ""))
		}
		windows = append(windows, p.room(0))
	}
	require.Equal(t, []int{2, 4, 8, 16, 32, 32}, windows, "slow start doubles each window, up to OUTBOX_DESTINATION_CONCURRENCY")
	require.EqualValues(t, 32, *p.remembered(), "the next job starts where this one ended")

	require.Equal(t, 12, sendingPace(12).room(0), "a remembered pace")
	require.Equal(t, 32, sendingPace(500).room(0), "never past the ceiling")
	require.Equal(t, 10, sendingPace(12).room(2), "room is the window less what is in flight")
}

// A receiver full of the relay's own requests (503 or 429 without
// Retry-After, with others in flight) halves the window once per burst, and
// the refusal is a throttle: no attempt, no failure. Alone in flight the
// same refusal is the receiver's own: it counts.
func TestARefusalTheRelayProvokedIsAThrottle(t *testing.T) {
	t.Parallel()
	p := sendingPace(32)
	burst := make([]uint64, 32)
	for i := range burst {
		burst[i] = p.send()
	}
	for i, seq := range burst[4:] {
		require.True(t, p.answer(signalFull, seq, 5+i, time.Time{}, "503"), "refused beside others: throttled")
	}
	require.Equal(t, 16, p.room(0), "halved once for the whole burst, not per refusal")
	require.Zero(t, p.failures, "a throttle is not a failure")
	require.Equal(t, stateSending, p.state)

	next := p.send()
	require.True(t, p.answer(signalFull, next, 2, time.Time{}, "503"), "a refusal of the next burst")
	require.Equal(t, 8, p.room(0), "halves again")

	alone := p.send()
	require.False(t, p.answer(signalFull, alone, 1, time.Time{}, "503 Service Unavailable"), "refused alone: the receiver's own")
	require.Equal(t, 1, p.failures)
	require.Equal(t, "503 Service Unavailable", p.lastFailure)
}

// Above where it was last cut, the window grows by one per window of
// successes (additive increase), and a timeout or a refused connection
// halves it (multiplicative decrease) as a full receiver does, while it
// counts as a failure.
func TestAPaceIsAIMD(t *testing.T) {
	t.Parallel()
	p := sendingPace(20)
	p.answer(signalSlow, p.send(), 20, time.Time{}, "timeout")
	require.Equal(t, 10, p.room(0), "a timeout halves the window")
	require.Equal(t, 1, p.failures, "and is a failure")
	successes := 0
	for p.room(0) == 10 {
		p.answer(signalUp, p.send(), 10, time.Time{}, "")
		successes++
	}
	require.Equal(t, 11, p.room(0))
	require.InDelta(t, 10, successes, 1, "about one window of successes adds one")
	require.Zero(t, p.failures, "an answer ends the run of failures")
	p.answer(signalRefused, p.send(), 11, time.Time{}, "connection refused")
	require.Equal(t, 5, p.room(0), "a refused connection halves it too")
	for range 20 {
		p.answer(signalRefused, p.send(), 1, time.Time{}, "connection refused")
	}
	require.Equal(t, 0, p.room(0), "the circuit is open")
	require.Equal(t, stateTripped, p.state)
}

// Endpoint-wide failures in a row trip the circuit at the threshold; the
// verdict backs the destination off until its first probe, five seconds
// on, and a failed probe doubles the wait.
func TestFailuresInARowTripTheCircuit(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	p := sendingPace(32)
	for i := range cfg.CircuitThreshold {
		require.Equal(t, stateSending, p.state, "after %d failures", i)
		p.answer(signalDown, p.send(), 1, time.Time{}, "500 Internal Server Error")
	}
	require.Equal(t, stateTripped, p.state)
	require.False(t, p.sending())
	now := time.Now()
	health, until, reason, failures := p.verdict(now, cfg)
	require.Equal(t, outbox.HealthBackingOff, health)
	require.InDelta(t, float64(5*time.Second), float64(until.Sub(now)), float64(time.Second))
	require.Equal(t, "500 Internal Server Error", *reason)
	require.Equal(t, cfg.CircuitThreshold, failures)
	require.Nil(t, p.remembered(), "a destination backing off starts low when it comes back")

	probe := newPace(cfg, outboxdb.DestinationLeaseRow{Health: outbox.HealthBackingOff, ConsecutiveFailures: int32(failures)})
	require.Equal(t, 1, probe.room(0), "one probe")
	require.Zero(t, probe.room(1), "one at a time")
	probe.answer(signalRefused, probe.send(), 1, time.Time{}, "connection refused")
	require.Equal(t, stateTripped, probe.state, "a failed probe")
	_, until, _, failures = probe.verdict(now, cfg)
	require.InDelta(t, float64(10*time.Second), float64(until.Sub(now)), float64(2*time.Second), "the next probe twice as far")
	require.Equal(t, cfg.CircuitThreshold+1, failures)
}

// A probe that gets an answer brings the destination back from a low
// window; one that is not made (nothing was due) changes nothing.
func TestAProbeAnsweredStartsLow(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	until := time.Now().Add(time.Minute)
	why := "connection refused"
	lease := outboxdb.DestinationLeaseRow{Health: outbox.HealthBackingOff, ConsecutiveFailures: 6, BackoffUntil: &until, HealthReason: &why}

	idle := newPace(cfg, lease)
	health, gotUntil, reason, failures := idle.verdict(time.Now(), cfg)
	require.Equal(t, outbox.HealthBackingOff, health, "no probe made: as it was")
	require.Equal(t, &until, gotUntil)
	require.Equal(t, &why, reason)
	require.Equal(t, 6, failures)

	p := newPace(cfg, lease)
	p.answer(signalUp, p.send(), 1, time.Time{}, "")
	require.Equal(t, stateSending, p.state)
	require.Equal(t, startWindow, p.room(0), "back from an outage: low")
	health, gotUntil, _, failures = p.verdict(time.Now(), cfg)
	require.Equal(t, outbox.HealthHealthy, health)
	require.Nil(t, gotUntil)
	require.Zero(t, failures)
}

// A Retry-After holds the whole destination until its end, and a 410
// pauses it; an answer that says nothing (a stop, a broker client's own
// refusal) changes nothing.
func TestAReceiverCanHoldOrPauseTheDestination(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	p := sendingPace(8)
	until := time.Now().Add(2 * time.Minute)
	p.answer(signalWait, p.send(), 3, until, "429 Too Many Requests")
	require.Equal(t, stateHeld, p.state)
	require.False(t, p.sending())
	health, got, _, _ := p.verdict(time.Now(), cfg)
	require.Equal(t, outbox.HealthHealthy, health, "held, not backing off")
	require.Equal(t, until, *got)

	gone := sendingPace(8)
	gone.answer(signalGone, gone.send(), 1, time.Time{}, "")
	require.Equal(t, stateGone, gone.state)
	require.False(t, gone.sending())

	quiet := sendingPace(8)
	quiet.answer(signalNone, quiet.send(), 8, time.Time{}, "")
	require.Equal(t, 8, quiet.room(0))
	require.Zero(t, quiet.failures)
}
