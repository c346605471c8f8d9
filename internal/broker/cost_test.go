package broker_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// The cost of a connection per destination (docs/brokers.md quotes these):
//
//	go test ./internal/broker/ -run '^$' -bench . -benchtime 2000x
//
// Spread: publishes to eight destinations at once, 32 in flight, as
// messages per second (compare with one destination: the same transport,
// the same publishes). First: the first publish to a destination, which
// makes its connection (RabbitMQ: TCP, AMQP handshake, a channel in
// confirm mode; Kafka: metadata, a producer id), against a publish on one
// already made. Idle: what an idle destination's connection holds in the
// worker, in goroutines and heap.

func BenchmarkRabbitMQ(b *testing.B) {
	dests := make([]string, 8)
	for i := range dests {
		_, exchange, key, _ := queue(b)
		dests[i] = "rabbitmq:" + exchange + "/" + key
	}
	// Fresh destinations: routing keys of a topic exchange whose one queue
	// takes them all.
	ch, fresh, _, q := queue(b)
	fresh += "-topic"
	require.NoError(b, ch.ExchangeDeclare(fresh, "topic", false, true, false, false, nil))
	require.NoError(b, ch.QueueBind(q, "#", fresh, false, nil))
	benchmarkTransport(b, func() relay.Transport { return broker.NewRabbitMQ(amqpURL(), source) }, dests, func(i int) string {
		return fmt.Sprintf("rabbitmq:%s/k%d", fresh, i)
	})
}

func BenchmarkKafka(b *testing.B) {
	topics := make([]string, 100)
	for i := range topics {
		topics[i] = fmt.Sprintf("t%d", i)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...))
	require.NoError(b, err)
	b.Cleanup(c.Close)
	dests := make([]string, 8)
	for i := range dests {
		dests[i] = "kafka:" + topics[i]
	}
	newTransport := func() relay.Transport {
		tr, err := broker.NewKafka(broker.Config{KafkaBrokers: c.ListenAddrs()}, source)
		require.NoError(b, err)
		return tr
	}
	benchmarkTransport(b, newTransport, dests, func(i int) string { return "kafka:" + topics[i%len(topics)] })
}

// benchmarkTransport runs the spread, first-publish and idle measurements
// on transports newTransport makes; fresh(i) is the ith destination never
// published to (under 100 of them for idle).
func benchmarkTransport(b *testing.B, newTransport func() relay.Transport, dests []string, fresh func(int) string) {
	closeT := func(tr relay.Transport) { tr.(interface{ Close() }).Close() }
	for _, n := range []int{1, len(dests)} {
		b.Run(fmt.Sprintf("spread/%d_destinations", n), func(b *testing.B) {
			tr := newTransport()
			defer closeT(tr)
			for _, d := range dests[:n] {
				require.True(b, tr.Deliver(ctxT(b), delivery(b, d, "")).Acked)
			}
			var next atomic.Int64
			b.SetParallelism(16) // 32 in flight on 2 cores
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d := dests[int(next.Add(1))%n]
					if res := tr.Deliver(context.Background(), delivery(b, d, "")); !res.Acked {
						b.Error(res.Err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
	b.Run("first_publish", func(b *testing.B) {
		for i := range b.N {
			b.StopTimer()
			tr := newTransport()
			b.StartTimer()
			res := tr.Deliver(ctxT(b), delivery(b, dests[0], ""))
			b.StopTimer()
			require.True(b, res.Acked, "publish %d: %v", i, res.Err)
			closeT(tr)
			b.StartTimer()
		}
	})
	b.Run("publish_on_an_open_connection", func(b *testing.B) {
		tr := newTransport()
		defer closeT(tr)
		require.True(b, tr.Deliver(ctxT(b), delivery(b, dests[0], "")).Acked)
		b.ResetTimer()
		for range b.N {
			require.True(b, tr.Deliver(ctxT(b), delivery(b, dests[0], "")).Acked)
		}
	})
	b.Run("idle_destination", func(b *testing.B) {
		const n = 100
		ds := make([]string, n)
		for i := range ds {
			ds[i] = fresh(i)
		}
		tr := newTransport()
		defer closeT(tr)
		goroutines, heap := usage()
		for _, d := range ds {
			require.True(b, tr.Deliver(ctxT(b), delivery(b, d, "")).Acked)
		}
		goroutines2, heap2 := usage()
		b.ReportMetric(float64(goroutines2-goroutines)/n, "goroutines/destination")
		b.ReportMetric(float64(heap2-heap)/n/1024, "heap-KiB/destination")
	})
}

// usage is the goroutines running and the heap in use, after a GC.
func usage() (int, uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return runtime.NumGoroutine(), m.HeapInuse
}
