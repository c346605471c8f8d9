package broker

import (
	"errors"
	"sync"
	"time"
)

// destinations holds a connection (or client) of its own for each broker
// destination, so one destination's trouble stays its own: a Kafka topic
// whose produce hangs no longer holds the produce requests of every other
// topic behind it (franz-go sends one request per broker at a time, in
// order), and a RabbitMQ connection that the broker blocks or stops
// reading (flow control and alarms act on whole connections), or that is
// dropped because one queue holds its confirms, carries one destination's
// publishes only. A connection is made at its destination's first
// publish, and closed once it has been idle for idleFor, so a deleted or
// quiet destination holds nothing for long. At most maxConns destinations
// have one at a time; any more share one more connection, rather than
// spend a broker's connections (a RabbitMQ server's file descriptors, 1024
// at its packaged defaults) without a bound.
type destinations[T any] struct {
	open  func(key string) T
	close func(T)
	// idleFor is how long an unused connection is kept; now is the clock
	// that judges it.
	idleFor  time.Duration
	now      func() time.Time
	maxConns int

	mu     sync.Mutex
	held   map[string]*pooled[T]
	closed bool
	swept  time.Time
}

// pooled is one destination's connection and its use.
type pooled[T any] struct {
	conn     T
	inUse    int
	lastUsed time.Time
}

const (
	// destinationIdleFor is how long a destination's connection outlives
	// its last publish: long enough that steady traffic, even a message
	// every few minutes, never waits for a dial.
	destinationIdleFor = 10 * time.Minute
	// maxDestinationConns bounds the destinations with a connection of
	// their own at once, far above what an orders service publishes to.
	maxDestinationConns = 100
	// sharedKey is the key of the connection the destinations beyond
	// maxDestinationConns share; no destination's key is empty.
	sharedKey = ""
)

func newDestinations[T any](open func(key string) T, close func(T)) *destinations[T] {
	return &destinations[T]{open: open, close: close, idleFor: destinationIdleFor, now: time.Now,
		maxConns: maxDestinationConns, held: map[string]*pooled[T]{}}
}

// errClosed is a publish after its transport's Close.
var errClosed = errors.New("the transport is closed")

// acquire returns key's connection, opening it if there is none, and the
// function that hands it back; it is not closed while in use.
func (ds *destinations[T]) acquire(key string) (T, func(), error) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.closed {
		var zero T
		return zero, nil, errClosed
	}
	now := ds.now()
	ds.sweep(now)
	d := ds.held[key]
	if d == nil && len(ds.held) >= ds.maxConns {
		key = sharedKey
		d = ds.held[key]
	}
	if d == nil {
		d = &pooled[T]{conn: ds.open(key)}
		ds.held[key] = d
	}
	d.inUse++
	return d.conn, func() {
		ds.mu.Lock()
		defer ds.mu.Unlock()
		d.inUse--
		d.lastUsed = ds.now()
	}, nil
}

// sweep closes the connections idle for idleFor, looking at most once
// every idleFor/10 rather than at every publish. Under the lock.
func (ds *destinations[T]) sweep(now time.Time) {
	if now.Sub(ds.swept) < ds.idleFor/10 {
		return
	}
	ds.swept = now
	for key, d := range ds.held {
		if d.inUse == 0 && now.Sub(d.lastUsed) >= ds.idleFor {
			delete(ds.held, key)
			go ds.close(d.conn)
		}
	}
}

// closeAll closes every connection, waiting for each to close, and makes
// every later acquire fail.
func (ds *destinations[T]) closeAll() {
	ds.mu.Lock()
	held := ds.held
	ds.held, ds.closed = nil, true
	ds.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range held {
		wg.Go(func() { ds.close(d.conn) })
	}
	wg.Wait()
}
