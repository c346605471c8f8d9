package broker_test

import (
	"context"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// The isolation the relay gives webhooks holds between broker destinations
// at the defaults: a destination whose topic, queue or connection is stuck
// does not delay another's messages. Each test times a healthy
// destination's publishes alone, then beside a stuck one kept busy with
// publishes that wait out their deadline, and requires the healthy one's
// p99 beside the stuck one to stay within twice its p99 alone plus 100 ms.

// isolationSamples is how many publishes of the healthy destination each
// measurement times.
const isolationSamples = 40

// stuckDeadline is the deadline of the stuck destination's publishes: what
// a healthy one would wait, behind them, without isolation.
const stuckDeadline = 2 * time.Second

// p99 times n calls of publish, one after another, and returns the 99th
// percentile; every call must be acked.
func p99(t *testing.T, n int, publish func(context.Context) relay.Result) time.Duration {
	t.Helper()
	took := make([]time.Duration, n)
	for i := range took {
		start := time.Now()
		res := publish(ctxT(t))
		took[i] = time.Since(start)
		require.NoError(t, res.Err)
		require.True(t, res.Acked, "the healthy destination's publish is acked")
	}
	slices.Sort(took)
	return took[(n*99+99)/100-1]
}

// keepBusy publishes to a stuck destination from four goroutines, each
// publish with stuckDeadline, until the test ends, as a relay keeps a
// destination's slots filled.
func keepBusy(t *testing.T, publish func(context.Context) relay.Result) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				pctx, pcancel := context.WithTimeout(ctx, stuckDeadline)
				publish(pctx)
				pcancel()
			}
		})
	}
}

// requireIsolated compares the healthy destination's p99 beside the stuck
// one with its p99 alone.
func requireIsolated(t *testing.T, alone, beside time.Duration) {
	t.Helper()
	t.Logf("healthy destination's p99: %s alone, %s beside the stuck one", alone, beside)
	require.LessOrEqual(t, beside, 2*alone+100*time.Millisecond,
		"a stuck destination does not delay another's messages (p99 %s alone, %s beside it)", alone, beside)
}

// A Kafka topic whose produce hangs (an acks=all waiting on a slow
// replica) holds only its own records: franz-go sends one produce request
// per broker at a time, so on a client shared with it every other topic's
// records waited behind it.
func TestAStuckKafkaTopicDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "stuck", "orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the cluster closes
	stuckID := topicID(t, c.ListenAddrs(), "stuck")
	stuck := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, topic := range req.(*kmsg.ProduceRequest).Topics {
			// Produce v13 names topics by id only.
			if topic.Topic == "stuck" || topic.TopicID == stuckID {
				select {
				case stuck <- struct{}{}:
				default:
				}
				c.SleepControl(func() { <-release })
				break
			}
		}
		return nil, nil, false
	})
	tr, err := broker.NewKafka(broker.Config{KafkaBrokers: c.ListenAddrs()}, source)
	require.NoError(t, err)
	t.Cleanup(tr.Close)
	healthy := func(ctx context.Context) relay.Result { return tr.Deliver(ctx, delivery(t, "kafka:orders", "order-7")) }

	alone := p99(t, isolationSamples, healthy)
	keepBusy(t, func(ctx context.Context) relay.Result { return tr.Deliver(ctx, delivery(t, "kafka:stuck", "order-8")) })
	select {
	case <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("no produce to the stuck topic reached the broker")
	}
	requireIsolated(t, alone, p99(t, isolationSamples, healthy))
}

// topicID asks the cluster for a topic's id.
func topicID(t *testing.T, addrs []string, topic string) [16]byte {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = &topic
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctxT(t), cl)
	require.NoError(t, err)
	require.Len(t, resp.Topics, 1)
	return resp.Topics[0].TopicID
}

// rabbitPair is a RabbitMQ transport behind a freezing proxy with two
// destinations, each with a queue of its own, and the proxy's connection
// number of the healthy one's connection.
type rabbitPair struct {
	f                *freezer
	tr               *broker.RabbitMQ
	stuck, healthy   string
	healthyConnOrder int
}

// newRabbitPair publishes once to the stuck destination, then once to the
// healthy one, so that the connection made for the healthy one, if any, is
// the proxy's second.
func newRabbitPair(t *testing.T) rabbitPair {
	t.Helper()
	_, exA, keyA, _ := queue(t)
	_, exB, keyB, _ := queue(t)
	u, err := url.Parse(amqpURL())
	require.NoError(t, err)
	f := newFreezer(t, u.Host)
	u.Host = f.ln.Addr().String()
	p := rabbitPair{f: f, tr: broker.NewRabbitMQ(u.String(), source), stuck: "rabbitmq:" + exA + "/" + keyA,
		healthy: "rabbitmq:" + exB + "/" + keyB, healthyConnOrder: 2}
	t.Cleanup(p.tr.Close)
	require.True(t, p.tr.Deliver(ctxT(t), delivery(t, p.stuck, "")).Acked)
	require.True(t, p.tr.Deliver(ctxT(t), delivery(t, p.healthy, "")).Acked)
	return p
}

func (p rabbitPair) publish(t *testing.T, dest string) func(context.Context) relay.Result {
	return func(ctx context.Context) relay.Result { return p.tr.Deliver(ctx, delivery(t, dest, "")) }
}

// A RabbitMQ destination whose confirms are held back (a queue without a
// quorum; here the proxy passes its publishes on and holds what the broker
// sends back, on its connection and on any it dials anew) delays no other
// destination: on a shared connection the healthy one's confirms were held
// too, and the connection dropped for the late ones failed its publishes
// in flight.
func TestARabbitMQDestinationWhoseConfirmsAreHeldDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	p := newRabbitPair(t)
	alone := p99(t, isolationSamples, p.publish(t, p.healthy))
	p.f.hold(func(conn int, toClient bool) bool { return toClient && conn != p.healthyConnOrder })
	keepBusy(t, p.publish(t, p.stuck))
	requireIsolated(t, alone, p99(t, isolationSamples, p.publish(t, p.healthy)))
}

// A RabbitMQ destination whose connection freezes (the broker blocks it,
// as its flow control does to a connection publishing faster than a queue
// takes, or the network drops its packets) delays no other destination.
func TestAFrozenRabbitMQConnectionDelaysNoOtherDestination(t *testing.T) {
	t.Parallel()
	p := newRabbitPair(t)
	alone := p99(t, isolationSamples, p.publish(t, p.healthy))
	p.f.hold(func(conn int, _ bool) bool { return conn != p.healthyConnOrder })
	keepBusy(t, p.publish(t, p.stuck))
	requireIsolated(t, alone, p99(t, isolationSamples, p.publish(t, p.healthy)))
}
