package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// The brokers measured: the project machines' own, or BENCH_NATS_URL and
// BENCH_AMQP_URL.
func benchNATSURL() string { return envOr("BENCH_NATS_URL", "nats://127.0.0.1:4222") }
func benchAMQPURL() string { return envOr("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// brokerTarget is one broker destination: the endpoint URL the relay
// publishes to, its transport, and how to empty it between runs.
type brokerTarget struct {
	name      string
	kind      string // destination.KindNATS, …: the Router key of transport
	url       string
	transport relay.Transport
	purge     func(context.Context) error
	close     func()
}

// natsTarget makes a file-backed stream of its own (duplicate window at
// JetStream's default, 2 minutes) on a subject of its own.
func natsTarget(ctx context.Context) (*brokerTarget, error) {
	nc, err := nats.Connect(benchNATSURL())
	if err != nil {
		return nil, fmt.Errorf("no NATS server at %s: %w", benchNATSURL(), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	name, subject := "BENCH_"+id, "bench."+id+".orders"
	s, err := brokertest.CreateStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("creating stream: %w", err)
	}
	t := broker.NewNATS(benchNATSURL(), "urn:bench:orders")
	return &brokerTarget{
		name: "NATS JetStream", kind: destination.KindNATS, url: "nats:" + subject, transport: t,
		purge: func(ctx context.Context) error { return s.Purge(ctx) },
		close: func() {
			t.Close()
			_ = js.DeleteStream(context.Background(), name)
			nc.Close()
		},
	}, nil
}

// rabbitTarget makes a durable exchange and a durable classic queue bound
// to it, so persistent messages are written to disk as in production.
func rabbitTarget() (*brokerTarget, error) {
	conn, err := amqp.Dial(benchAMQPURL())
	if err != nil {
		return nil, fmt.Errorf("no RabbitMQ at %s: %w", benchAMQPURL(), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	id := uuid.NewString()
	exchange, queue := "bench-"+id, "bench-q-"+id
	if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if err := ch.QueueBind(queue, "order.placed", exchange, false, nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	t := broker.NewRabbitMQ(benchAMQPURL(), "urn:bench:orders")
	return &brokerTarget{
		name: "RabbitMQ", kind: destination.KindRabbitMQ, url: "rabbitmq:" + exchange + "/order.placed", transport: t,
		purge: func(context.Context) error { _, err := ch.QueuePurge(queue, false); return err },
		close: func() {
			t.Close()
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
			_ = conn.Close()
		},
	}, nil
}

// rawPublish publishes n order events through t from workers goroutines,
// with no database: the same client, publish options and acks as the
// relay's, as fast as they go. It returns messages/s.
func rawPublish(ctx context.Context, t relay.Transport, url string, n, workers int) (float64, error) {
	data, _ := json.Marshal(map[string]any{"id": uuid.New(), "customer_id": "c-1", "status": "placed", "total_cents": 1000,
		"created_at": time.Now(), "lines": []map[string]any{{"sku": "A-1", "quantity": 1, "unit_price_cents": 500},
			{"sku": "B-2", "quantity": 1, "unit_price_cents": 500}}})
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				id := uuid.Must(uuid.NewV7())
				res := t.Deliver(ctx, relay.Delivery{EventID: id, MessageID: id, Type: "order.placed", URL: url,
					Data: data, CreatedAt: time.Now(), Header: http.Header{}})
				if !res.Acked {
					once.Do(func() { firstErr = fmt.Errorf("raw publish: %v", res.Err) })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// scenarioBrokers drains a backlog to a broker destination with the real
// relay, beside a raw publish loop on the same transport, for JetStream and
// for RabbitMQ, interleaved run by run.
func scenarioBrokers(ctx context.Context, cfg config, rep *report) error {
	var targets []*brokerTarget
	var missing []string
	if t, err := natsTarget(ctx); err != nil {
		missing = append(missing, err.Error())
	} else {
		targets = append(targets, t)
	}
	if t, err := rabbitTarget(); err != nil {
		missing = append(missing, err.Error())
	} else {
		targets = append(targets, t)
	}
	defer func() {
		for _, t := range targets {
			t.close()
		}
	}()
	if len(targets) == 0 {
		rep.section("11. Broker destinations", "Not run: "+strings.Join(missing, "; ")+".\n")
		return nil
	}
	db, err := newDatabase(ctx)
	if err != nil {
		return err
	}
	defer db.drop() //nolint:errcheck
	watch, err := db.pool(ctx, 4)
	if err != nil {
		return err
	}
	defer watch.Close()
	if err := addEndpoints(ctx, watch, 1, "http://127.0.0.1:9/unused"); err != nil {
		return err
	}

	n := cfg.BrokerDrain
	workers := relay.DefaultConfig().DestinationConcurrency
	router := relay.Router{}
	for _, t := range targets {
		router[t.kind] = t.transport
	}
	relayRates, rawRates, outboxRates := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	for range cfg.Reps {
		for _, t := range targets {
			if err := t.purge(ctx); err != nil {
				return err
			}
			raw, err := rawPublish(ctx, t.transport, t.url, n, workers)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if err := t.purge(ctx); err != nil {
				return err
			}
			if err := resetOutbox(ctx, watch); err != nil {
				return err
			}
			if _, err := watch.Exec(ctx, "UPDATE webhook_endpoints SET url = $1", t.url); err != nil {
				return err
			}
			if err := preloadPending(ctx, watch, n); err != nil {
				return err
			}
			r, err := relayDrain(ctx, db.url, watch, n, relaySetup{Config: relay.DefaultConfig(), Transport: router})
			if err != nil {
				return fmt.Errorf("%s relay: %w", t.name, err)
			}
			// The raw outbox loop: what any relay of this outbox pays at
			// least, the database's part of a delivery and nothing else.
			if err := t.purge(ctx); err != nil {
				return err
			}
			if err := resetOutbox(ctx, watch); err != nil {
				return err
			}
			if err := preloadPending(ctx, watch, n); err != nil {
				return err
			}
			o, err := rawDrain(ctx, db.url, n, 1, t.transport, workers)
			if err != nil {
				return fmt.Errorf("%s raw outbox loop: %w", t.name, err)
			}
			rawRates[t.name] = append(rawRates[t.name], raw)
			relayRates[t.name] = append(relayRates[t.name], r)
			outboxRates[t.name] = append(outboxRates[t.name], o)
			logf("  %s: relay %s msgs/s, raw outbox loop %s msgs/s, raw publish %s msgs/s", t.name, rate(r), rate(o), rate(raw))
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "A backlog of **%s pending messages to one broker destination** (each the one delivery of its own event, ~300-byte order payloads, seeded in one statement) drained by the real relay "+
		"(`relay.New` + `Relay.Start`, `relay.DefaultConfig()`: %d publishes in flight to the destination, a 20-connection pool; the clock starts before the relay starts), "+
		"beside a **raw** loop: %d goroutines publishing %s events through the same transport (the same client, publish options and acks, no database). "+
		"JetStream: a file-backed stream on the local server, each publish with `Nats-Msg-Id` and waiting for the stream's ack. "+
		"RabbitMQ: a durable direct exchange and a durable classic queue on the local server, persistent messages, mandatory, each waiting for its publisher confirm. "+
		"Beside them, the **raw outbox loop**: the same backlog drained by one connection claiming 100 messages with SKIP LOCKED, publishing each through the same transport, %d at a time (the relay's bound per destination), and marking them delivered: "+
		"no River, no lease, no attempt history, what the raw HTTP loop (h) of section 2 is for webhooks. It is the least any relay of this outbox pays per message, and so how close to the raw publish loop one can come here. "+
		"Medians of %d runs, the three interleaved run by run.\n\n", commas(int64(n)), workers, workers, commas(int64(n)), workers, cfg.Reps)
	b.WriteString("| broker | raw publish loop | raw outbox loop | relay | relay / raw publish | raw outbox loop / raw publish | relay / raw outbox loop |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, t := range targets {
		raw, relay, floor := median(rawRates[t.name]), median(relayRates[t.name]), median(outboxRates[t.name])
		fmt.Fprintf(&b, "| %s | %s msgs/s | %s msgs/s | %s msgs/s | **%.2f** | %.2f | %.2f |\n", t.name, rate(raw), rate(floor), rate(relay), relay/raw, floor/raw, relay/floor)
		rep.target(t.name+": relay vs raw publish loop", "≥ 0.5", fmt.Sprintf("%.2f (%s vs %s msgs/s)", relay/raw, rate(relay), rate(raw)), relay/raw >= 0.5)
		rep.results["brokers."+t.name] = relay / raw
		if t.kind == destination.KindNATS {
			rep.target(t.name+": relay vs raw outbox loop", "≥ 0.9", fmt.Sprintf("%.2f (%s vs %s msgs/s)", relay/floor, rate(relay), rate(floor)), relay >= 0.9*floor)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(&b, "\nNot measured: %s.\n", strings.Join(missing, "; "))
	}
	rep.section("11. Broker destinations", b.String())
	return nil
}
