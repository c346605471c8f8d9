package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/consumer"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// natsURL is the NATS server with JetStream the lab publishes to.
func natsURL() string {
	if v := os.Getenv("WORKSHOP_NATS_URL"); v != "" {
		return v
	}
	return "nats://127.0.0.1:4222"
}

// lab10 shows what a broker's deduplication covers and what only the
// consumer's inbox does: the relay publishes orders to a JetStream stream
// (Nats-Msg-Id = event id), then the same events are replayed to it twice,
// once inside the stream's duplicate window and once after it; the
// reference consumer reads the stream.
func lab10(l *lab) (*Report, error) {
	n := l.size(5)
	// JetStream's default window is 2 minutes; the lab's is short so it
	// runs in seconds. Only the length differs: long enough that the
	// replay inside it lands there on a loaded machine too.
	const window = 5 * time.Second
	nc, err := nats.Connect(natsURL())
	if err != nil {
		return nil, fmt.Errorf("this lab needs NATS with JetStream at %s (WORKSHOP_NATS_URL): %w", natsURL(), err)
	}
	l.defer_(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	name, subject := "WORKSHOP_"+id, "workshop."+id+".orders"
	stream, err := brokertest.CreateStream(l.ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Duplicates: window})
	if err != nil {
		return nil, fmt.Errorf("creating the stream: %w", err)
	}
	l.defer_(func() { _ = js.DeleteStream(context.Background(), name) })
	stored := func() (int64, error) {
		info, err := stream.Info(l.ctx)
		if err != nil {
			return 0, err
		}
		return int64(info.State.Msgs), nil
	}

	ep, err := l.endpoint("nats:"+subject, orders.EventPlaced)
	if err != nil {
		return nil, err
	}
	pub := broker.NewNATS(natsURL(), "urn:workshop:orders")
	l.defer_(pub.Close)
	if _, err := l.startRelay(labRelayConfig(), relay.Router{destination.KindNATS: pub}); err != nil {
		return nil, err
	}
	l.p.Step("placing %d orders; the relay publishes each event to JetStream subject %s (duplicate window %s)", n, subject, window)
	svc := orders.NewService(l.pool, discardLogger())
	started := time.Now()
	for i := range n {
		if _, _, err := svc.Place(l.ctx, orders.PlaceRequest{CustomerID: fmt.Sprintf("c-%d", i),
			Lines: []orders.Line{{SKU: "A-1", Quantity: 1, UnitPriceCents: 500}}}); err != nil {
			return nil, err
		}
	}
	delivered := func(want int64) func() (bool, string, error) {
		return func() (bool, string, error) {
			s, err := l.stats()
			if err != nil {
				return false, "", err
			}
			// The relay marks a broker message delivered once the broker
			// acked it: once it is stored in the stream.
			return s.Delivered >= want && s.Pending == 0 && s.Claimed == 0, fmt.Sprintf("%s, acked by JetStream", countText(s.Delivered, want, "published")), nil
		}
	}
	if err := l.waitFor(30*time.Second, "the orders published", delivered(int64(n))); err != nil {
		return nil, err
	}
	// Every first publish was acked before now: the window of the last one
	// ends before published + window.
	published := time.Now()
	first, err := stored()
	if err != nil {
		return nil, err
	}

	adm := l.admin()
	replay := func(want int64) error {
		if _, err := adm.ReplayEvents(l.ctx, ep.ID, admin.Replay{From: started.Add(-time.Minute), To: time.Now().Add(time.Minute)}); err != nil {
			return err
		}
		return l.waitFor(30*time.Second, "the replay published", delivered(want))
	}
	l.p.Step("replaying the same %d events inside the window: the relay publishes them again, same Nats-Msg-Id", n)
	if err := replay(int64(2 * n)); err != nil {
		return nil, err
	}
	inside, err := stored()
	if err != nil {
		return nil, err
	}
	insideAt := time.Since(started)
	if insideAt >= window {
		return nil, fmt.Errorf("the replay meant for inside the %s window ended %s after the first publish: the machine is too slow for this lab", window, seconds(insideAt))
	}
	l.p.Step("waiting out the %s window, then replaying them once more", window)
	if wait := time.Until(published.Add(window + 500*time.Millisecond)); wait > 0 {
		// The window is time itself: nothing else to wait on.
		time.Sleep(wait)
	}
	if err := replay(int64(3 * n)); err != nil {
		return nil, err
	}
	after, err := stored()
	if err != nil {
		return nil, err
	}

	l.p.Step("the reference consumer reads the stream (durable pull consumer, inbox, ack after commit)")
	if err := consumer.Migrate(l.ctx, l.pool, discardLogger()); err != nil {
		return nil, err
	}
	c := consumer.New(l.pool, nil, discardLogger())
	cons, err := stream.CreateOrUpdateConsumer(l.ctx, jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(l.ctx)
	done := make(chan error, 1)
	go func() { done <- c.ConsumeNATS(ctx, cons) }()
	err = l.waitFor(30*time.Second, "the consumer to settle every message", func() (bool, string, error) {
		info, err := cons.Info(l.ctx)
		if err != nil {
			return false, "", err
		}
		return info.NumPending == 0 && info.NumAckPending == 0, fmt.Sprintf("%d waiting", info.NumPending+uint64(info.NumAckPending)), nil
	})
	cancel()
	if cerr := <-done; err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	s, err := c.Stats(l.ctx)
	if err != nil {
		return nil, err
	}

	r := newReport("Lab 10: the broker's dedup window and the consumer's inbox")
	r.Section("JetStream (Nats-Msg-Id = event id)")
	r.Count("published", "events published by the relay", int64(n), "")
	r.Count("stored.first", "stored in the stream", first, "")
	r.Count("stored.inside", "after a replay inside the window", inside, fmt.Sprintf("(at %s: dropped as duplicates)", seconds(insideAt)))
	r.Count("stored.after", "after a replay past the window", after, "(stored again)")
	r.Section("The consumer's inbox")
	r.Count("applied", "applied", s.Applied, "")
	r.Count("duplicates", "duplicates caught by the inbox", s.Duplicates, "")
	r.Count("ledger", "ledger entries", s.LedgerTotal, "")
	r.Verdict("Inside its window JetStream dropped the republished events; past it they were stored again.")
	r.Verdict("Only the inbox caught those: each order was applied once.")
	return r, nil
}
