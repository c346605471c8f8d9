package relay

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Retry-After is read as delay-seconds or an HTTP date; a delay too long
// for a Duration is a long wait, never an overflow into a short or
// negative one (18446744074 s wrapped to 0.29 s).
func TestRetryAfterIsReadWithoutOverflow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	year := 365 * 24 * time.Hour
	for v, want := range map[string]time.Duration{
		"":                        0,
		"120":                     2 * time.Minute,
		" 7 ":                     7 * time.Second,
		"0":                       0,
		"-1":                      0,
		"+5":                      0,
		"soon":                    0,
		"9223372037":              year,
		"18446744074":             year,
		"99999999999999999999999": year,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Hour).Format(http.TimeFormat):       0,
	} {
		require.Equal(t, want, parseRetryAfter(v, now), "%q", v)
	}
}
