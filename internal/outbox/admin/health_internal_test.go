package admin

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Percentiles are estimated within the bucket that holds them, between its
// fastest and slowest request: exact when those are equal, linear between
// them otherwise, and never outside what was measured.
func TestPercentileFromBuckets(t *testing.T) {
	t.Parallel()
	require.Zero(t, percentile(nil, 0.5), "no requests, no figure")

	same := []latencyBucket{{lower: 5, upper: 10, n: 3, min: 8, max: 8}}
	for _, q := range []float64{0.5, 0.95, 0.99} {
		require.Equal(t, 8.0, percentile(same, q), "three requests of 8 ms")
	}

	// 100 requests of 1 to 100 ms, as the buckets up to 100 ms hold them.
	uniform := []latencyBucket{
		{lower: 0, upper: 1, n: 1, min: 1, max: 1},
		{lower: 1, upper: 2, n: 1, min: 2, max: 2},
		{lower: 2, upper: 5, n: 3, min: 3, max: 5},
		{lower: 5, upper: 10, n: 5, min: 6, max: 10},
		{lower: 10, upper: 20, n: 10, min: 11, max: 20},
		{lower: 20, upper: 50, n: 30, min: 21, max: 50},
		{lower: 50, upper: 100, n: 50, min: 51, max: 100},
	}
	require.InDelta(t, 51, percentile(uniform, 0.5), 1)
	require.InDelta(t, 95, percentile(uniform, 0.95), 1)
	require.InDelta(t, 99, percentile(uniform, 0.99), 1)

	// The last bucket has no upper bound: its slowest request is one.
	slow := []latencyBucket{{lower: 60000, upper: 2147483647, n: 2, min: 61000, max: 90000}}
	require.InDelta(t, 61000+0.99*29000, percentile(slow, 0.99), 0.001)
	require.InDelta(t, 61000+0.5*29000, percentile(slow, 0.5), 0.001)
}
