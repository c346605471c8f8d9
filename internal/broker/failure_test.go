package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// freezer is a TCP proxy in front of a real broker that can stop passing
// bytes on while keeping every connection open: a broker that accepts and
// then never answers (a RabbitMQ memory alarm stops reading a publishing
// connection; a hung server; a network that drops without a reset).
type freezer struct {
	ln       net.Listener
	accepted atomic.Int32 // connections made through it
	mu       sync.Mutex
	frozen   bool
	// holds, when set, says which bytes to hold besides: those of the
	// nth connection made (from 1), one way (toClient: the broker's
	// answers) or the other.
	holds  func(n int, toClient bool) bool
	thawed *sync.Cond
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &freezer{ln: ln}
	f.thawed = sync.NewCond(&f.mu)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(f.accepted.Add(1))
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			go f.pipe(c, up, n, false)
			go f.pipe(up, c, n, true)
		}
	}()
	t.Cleanup(func() {
		f.hold(nil)
		f.freeze(false)
		ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	})
	return f
}

// pipe copies from src to dst, the nth connection's bytes one way, holding
// what it read while frozen or held.
func (f *freezer) pipe(src, dst net.Conn, conn int, toClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		for f.frozen || f.holds != nil && f.holds(conn, toClient) {
			f.thawed.Wait()
		}
		f.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (f *freezer) freeze(on bool) {
	f.mu.Lock()
	f.frozen = on
	f.mu.Unlock()
	f.thawed.Broadcast()
}

// hold holds the bytes holds names from now on (nil: none).
func (f *freezer) hold(holds func(conn int, toClient bool) bool) {
	f.mu.Lock()
	f.holds = holds
	f.mu.Unlock()
	f.thawed.Broadcast()
}

// within runs fn and reports an error if it has not returned after d (safe
// from any goroutine, so fn must not call require).
func within(t *testing.T, d time.Duration, what string, fn func()) bool {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		t.Errorf("%s: still waiting after %s", what, d)
		return false
	}
}

// A RabbitMQ broker that stops answering holds a publish no longer than
// its deadline: neither the publish that timed out, nor the ones after it
// (a channel to open), nor Close, waits for the broker.
func TestRabbitMQThatStopsAnsweringHoldsNoPublishPastItsDeadline(t *testing.T) {
	t.Parallel()
	_, exchange, key, _ := queue(t)
	u, err := url.Parse(amqpURL())
	require.NoError(t, err)
	f := newFreezer(t, u.Host)
	u.Host = f.ln.Addr().String()
	tr := broker.NewRabbitMQ(u.String(), source)
	dest := "rabbitmq:" + exchange + "/" + key
	require.True(t, tr.Deliver(ctxT(t), delivery(t, dest, "")).Acked, "through the proxy while it passes bytes on")

	f.freeze(true)
	d := delivery(t, dest, "")
	// One publish on the idle channel, the others needing a channel of
	// their own: each ends at its deadline with a failure.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			within(t, 4*time.Second, "a publish to a broker that stopped answering", func() {
				res := tr.Deliver(ctx, relay.Delivery{EventID: d.EventID, MessageID: d.MessageID, Type: d.Type,
					URL: dest, Data: d.Data, CreatedAt: d.CreatedAt})
				// Its deadline, or the connection dropped under it when
				// another's deadline came first: a failure either way.
				assert.False(t, res.Acked)
				assert.Error(t, res.Err)
			})
		})
	}
	wg.Wait()
	// The connection the broker stopped answering on was dropped: once it
	// answers again, a publish goes through on a new one.
	f.freeze(false)
	require.True(t, tr.Deliver(ctxT(t), delivery(t, dest, "")).Acked)
	require.EqualValues(t, 2, f.accepted.Load(), "a new connection, not the one that stopped answering")
	require.True(t, within(t, 4*time.Second, "Close", tr.Close))
	res := tr.Deliver(ctxT(t), delivery(t, dest, ""))
	require.ErrorContains(t, res.Err, "closed", "a closed transport publishes nothing, and dials nothing")
}

// A publish returns by its deadline even when the broker stops reading
// mid-message (RabbitMQ under a memory or disk alarm blocks a publishing
// connection): amqp091-go checks the context only before it writes, and a
// message larger than the socket buffers blocks in the write itself. A
// small message fits the buffers and waits for its confirm instead; both
// end at the deadline, and the next publish, once the broker reads again,
// goes through on a new connection.
func TestRabbitMQPublishReturnsByItsDeadlineWhenTheBrokerStopsReading(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		size int
	}{{"small", 100}, {"16 MiB", 16 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, exchange, key, _ := queue(t)
			u, err := url.Parse(amqpURL())
			require.NoError(t, err)
			f := newFreezer(t, u.Host)
			u.Host = f.ln.Addr().String()
			tr := broker.NewRabbitMQ(u.String(), source)
			t.Cleanup(tr.Close)
			dest := "rabbitmq:" + exchange + "/" + key
			require.True(t, tr.Deliver(ctxT(t), delivery(t, dest, "")).Acked, "through the proxy while it passes bytes on")

			f.freeze(true)
			d := delivery(t, dest, "")
			d.Data = json.RawMessage(`"` + strings.Repeat("x", tc.size) + `"`)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var res relay.Result
			require.True(t, within(t, 3*time.Second, "a publish to a broker that stopped reading", func() {
				res = tr.Deliver(ctx, d)
			}), "the publish returned by its deadline (1 s), not when the broker reads again")
			require.False(t, res.Acked)
			require.Error(t, res.Err)

			f.freeze(false)
			require.True(t, tr.Deliver(ctxT(t), delivery(t, dest, "")).Acked, "once the broker reads again, the next publish goes")
		})
	}
}

// A Kafka broker that takes a produce and never answers holds it no longer
// than its deadline: the idempotent producer would otherwise wait for the
// answer whatever the context says.
func TestKafkaThatStopsAnsweringHoldsNoProducePastItsDeadline(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the cluster closes
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	tr, err := broker.NewKafka(broker.Config{KafkaBrokers: c.ListenAddrs()}, source)
	require.NoError(t, err)
	t.Cleanup(tr.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var res relay.Result
	d := delivery(t, "kafka:orders", "order-7")
	require.True(t, within(t, 5*time.Second, "a produce to a broker that stopped answering", func() {
		res = tr.Deliver(ctx, d)
	}))
	require.False(t, res.Acked)
	require.Error(t, res.Err)
}

// A broker URL holds credentials: no error quotes it, neither at start
// nor in a delivery's error (stored in the attempt history and logged).
func TestBrokerURLsStayOutOfErrors(t *testing.T) {
	t.Parallel()
	const secret = "s3cr%zz"
	natsBad, amqpBad := "nats://relay:"+secret+"@127.0.0.1:4222", "amqp://relay:"+secret+"@127.0.0.1:5672/"
	for name, err := range map[string]error{
		"CheckNATSURL": broker.CheckNATSURL(natsBad),
		"CheckAMQPURL": broker.CheckAMQPURL(amqpBad),
		"NATS publish": broker.NewNATS(natsBad, source).Deliver(ctxT(t), delivery(t, "nats:orders", "")).Err,
		"RabbitMQ publish": broker.NewRabbitMQ(amqpBad, source).Deliver(ctxT(t),
			delivery(t, "rabbitmq:orders/order.placed", "")).Err,
	} {
		require.ErrorContains(t, err, "does not parse", name)
		require.NotContains(t, err.Error(), "s3cr", name)
	}
	_, _, err := broker.Transports(broker.Config{AMQPURL: amqpBad, Source: source})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cr")
	require.NoError(t, broker.CheckNATSURL("127.0.0.1:4222, tls://a.example:4222"), "bare host:port and lists, as nats.Connect takes them")
	require.NoError(t, broker.CheckAMQPURL(amqpURL()))
	require.NoError(t, errors.Join(broker.CheckNATSURL(""), broker.CheckAMQPURL("")), "unset: no broker of that kind")
}

// Close is final: a NATS transport closed while publishes still come makes
// no new connection for them.
func TestNATSClosedPublishesNothing(t *testing.T) {
	t.Parallel()
	_, subject := stream(t)
	tr := broker.NewNATS(natsURL(), source)
	require.True(t, tr.Deliver(ctxT(t), delivery(t, "nats:"+subject, "")).Acked)
	tr.Close()
	res := tr.Deliver(ctxT(t), delivery(t, "nats:"+subject, ""))
	require.False(t, res.Acked)
	require.ErrorContains(t, res.Err, "closed")
}

// A broker address that accepts connections and never speaks (a hung
// server, or packets dropped without a reset) costs the publishes waiting
// behind a dial one dial timeout in all, not one apiece: a dial holds the
// transport's lock, and the failure answers for the publishes queued
// behind it.
func TestSilentBrokerFailsWaitingPublishesTogether(t *testing.T) {
	t.Parallel()
	addr := silentServer(t)
	for _, tc := range []struct {
		name string
		tr   relay.Transport
		dest string
	}{
		{"nats", broker.NewNATS("nats://"+addr, source), "nats:orders.events"},
		{"rabbitmq", broker.NewRabbitMQ("amqp://guest:guest@"+addr+"/", source), "rabbitmq:orders/placed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Eight publishes, as a destination's slots fill at once; each
			// has more time than eight dials would take one after another.
			start := time.Now()
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					res := tc.tr.Deliver(ctx, delivery(t, tc.dest, ""))
					assert.ErrorContains(t, res.Err, "connecting to")
				})
			}
			wg.Wait()
			// One dial timeout (5 s), with room for a second dial begun as
			// the first one's failure expired; eight in a row take 40 s.
			require.Less(t, time.Since(start), 12*time.Second, "the publishes failed together, not one dial timeout apiece")
		})
	}
}

// A NATS connection the network silently cut (no reset: the server stops
// answering, bytes go nowhere) is noticed by its pings within about half a
// minute and dialed anew, not after nats.go's default of 4 to 6 minutes of
// publishes timing out on it.
func TestNATSNoticesASilentlyCutConnection(t *testing.T) {
	t.Parallel()
	_, subject := stream(t)
	u, err := url.Parse(natsURL())
	require.NoError(t, err)
	f := newFreezer(t, u.Host)
	u.Host = f.ln.Addr().String()
	tr := broker.NewNATS(u.String(), source)
	t.Cleanup(tr.Close)
	require.True(t, tr.Deliver(ctxT(t), delivery(t, "nats:"+subject, "")).Acked, "through the proxy while it passes bytes on")

	f.freeze(true)
	start := time.Now()
	require.Eventually(t, func() bool { return f.accepted.Load() >= 2 }, 45*time.Second, 100*time.Millisecond,
		"the client gave the silent connection up and dialed again")
	t.Logf("redialed %s after the connection went silent", time.Since(start).Round(time.Second))
}

// silentServer listens on a loopback port, accepts connections and never
// answers them: a broker that takes the TCP connection and then hangs.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var accepted []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range accepted {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// A publish waits for a dial no longer than its own deadline: against a
// server that accepts and never answers, a dial takes its timeout (5 s)
// per seed address, and the delivery's deadline (OUTBOX_DELIVERY_TIMEOUT)
// bounds what the relay waits for any destination.
func TestADialHoldsNoPublishPastItsDeadline(t *testing.T) {
	t.Parallel()
	addr := silentServer(t)
	for _, tc := range []struct {
		name string
		tr   relay.Transport
		dest string
	}{
		// Three seeds, all silent: 15 s of dialing.
		{"nats", broker.NewNATS("nats://"+addr+",nats://"+addr+",nats://"+addr, source), "nats:orders.events"},
		{"rabbitmq", broker.NewRabbitMQ("amqp://guest:guest@"+addr+"/", source), "rabbitmq:orders/placed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					start := time.Now()
					res := tc.tr.Deliver(ctx, delivery(t, tc.dest, ""))
					waited := time.Since(start)
					assert.ErrorIs(t, res.Err, context.DeadlineExceeded)
					assert.Less(t, waited, 2*time.Second, "the publish ended at its deadline (1 s), not the dial's (5 s or more)")
				})
			}
			wg.Wait()
		})
	}
}
