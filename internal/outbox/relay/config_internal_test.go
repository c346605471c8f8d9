package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The zero config is the defaults, a field set is kept, and a negative
// count or duration is refused naming its field: what adding a knob (a
// field and its default) gets without further code.
func TestZeroFieldsTakeTheirDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, DefaultConfig(), Config{}.withDefaults())

	set := Config{PollInterval: time.Second, DeliverWorkers: 3, Listen: true}.withDefaults()
	want := DefaultConfig()
	want.PollInterval, want.DeliverWorkers, want.Listen = time.Second, 3, true
	require.Equal(t, want, set)

	err := Config{BatchSize: -1, PruneInterval: -time.Second}.Validate()
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	require.EqualError(t, err, "BatchSize: must be positive, got -1\nPruneInterval: must be positive, got -1s")
}

// An empty retry schedule is refused at start: it has no wait to give, and
// the first failed attempt would find none.
func TestAnEmptyRetryScheduleIsRefused(t *testing.T) {
	t.Parallel()
	require.EqualError(t, Config{RetrySchedule: []time.Duration{}}.Validate(),
		"RetrySchedule: must hold at least one wait (nil for the default)")
	require.NoError(t, Config{}.Validate(), "nil takes the default")
}

// A wait longer than a year is refused at start: its ±10 % jitter
// overflows a Duration past 29 years, into a short or negative wait.
func TestRetryWaitsAreBounded(t *testing.T) {
	t.Parallel()
	long := 30 * 365 * 24 * time.Hour
	require.ErrorContains(t, Config{RetrySchedule: []time.Duration{time.Second, long}}.Validate(),
		"RetrySchedule: entry 2 must be from 1ns to 8760h0m0s")
	require.ErrorContains(t, Config{BackoffBase: time.Second, BackoffMax: long}.Validate(), "BackoffMax: ")
	require.NoError(t, Config{RetrySchedule: []time.Duration{365 * 24 * time.Hour}}.Validate())
	require.Positive(t, jitter(365*24*time.Hour, 10), "a year's jitter does not overflow")
}
