package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The session keeps as many windows ready as go out during a claim: one
// to a receiver slower than the database (a claim then lasts about as long
// as its request), more to one that answers faster than a claim comes
// back, never more than maxLead.
func TestLeadCoversAClaimsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		claim, answer time.Duration
		lead          int
	}{
		{"nothing answered yet", 5 * time.Millisecond, 0, 1},
		{"receiver slower than a claim", 5 * time.Millisecond, 300 * time.Millisecond, 1},
		{"claim as long as a request", 2 * time.Millisecond, 2 * time.Millisecond, 1},
		{"claim three requests long", 6 * time.Millisecond, 2 * time.Millisecond, 3},
		{"claim a little over two", 4100 * time.Microsecond, 2 * time.Millisecond, 3},
		{"claim far slower than the receiver", 50 * time.Millisecond, time.Millisecond, maxLead},
	} {
		s := &session{claimTook: c.claim, answerTook: c.answer}
		require.Equal(t, c.lead, s.lead(), c.name)
	}
}

// The moving average starts at its first sample and then moves an eighth
// of the way to each.
func TestAverageStartsAtItsFirstSample(t *testing.T) {
	t.Parallel()
	avg := average(0, 8*time.Millisecond)
	require.Equal(t, 8*time.Millisecond, avg)
	avg = average(avg, 16*time.Millisecond)
	require.Equal(t, 9*time.Millisecond, avg)
}
