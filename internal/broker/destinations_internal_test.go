package broker

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A destination's connection is kept while it is used, closed once it has
// been idle for idleFor (never while a publish holds it), and made anew at
// the next publish; Close closes them all and refuses later publishes.
func TestDestinationConnectionsCloseWhenIdle(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	opened, closed := map[string]int{}, map[string]int{}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ds := newDestinations(func(key string) string {
		mu.Lock()
		defer mu.Unlock()
		opened[key]++
		return key
	}, func(key string) {
		mu.Lock()
		defer mu.Unlock()
		closed[key]++
	})
	ds.now = func() time.Time { return now }
	closedCount := func(key string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return closed[key] == 1
		}
	}

	a, releaseA, err := ds.acquire("a")
	require.NoError(t, err)
	require.Equal(t, "a", a)
	_, releaseB, err := ds.acquire("b")
	require.NoError(t, err)
	releaseB()
	_, releaseA2, err := ds.acquire("a")
	require.NoError(t, err)
	releaseA2()
	require.Equal(t, map[string]int{"a": 1, "b": 1}, opened, "one connection per destination, kept between publishes")

	now = now.Add(destinationIdleFor)
	_, releaseC, err := ds.acquire("c")
	require.NoError(t, err)
	releaseC()
	require.Eventually(t, closedCount("b"), 5*time.Second, time.Millisecond, "b, idle for idleFor, is closed")
	mu.Lock()
	require.Zero(t, closed["a"], "a is in use (one publish still holds it): never closed under it")
	mu.Unlock()

	releaseA()
	_, releaseB, err = ds.acquire("b")
	require.NoError(t, err)
	releaseB()
	mu.Lock()
	require.Equal(t, 2, opened["b"], "b is made anew at its next publish")
	mu.Unlock()

	ds.closeAll()
	mu.Lock()
	require.Equal(t, map[string]int{"a": 1, "b": 2, "c": 1}, closed, "Close closes every connection")
	mu.Unlock()
	_, _, err = ds.acquire("a")
	require.ErrorIs(t, err, errClosed)
}

// Beyond maxConns destinations with a connection of their own at once, the
// others share one more: the broker's connections stay bounded.
func TestDestinationsBeyondTheBoundShareOneConnection(t *testing.T) {
	t.Parallel()
	var opened []string
	ds := newDestinations(func(key string) string {
		opened = append(opened, key)
		return key
	}, func(string) {})
	ds.maxConns = 2
	t.Cleanup(ds.closeAll)
	for _, key := range []string{"a", "b", "c", "d", "a"} {
		_, release, err := ds.acquire(key)
		require.NoError(t, err)
		release()
	}
	require.Equal(t, []string{"a", "b", sharedKey}, opened, "a and b have their own; c and d share one")
}
