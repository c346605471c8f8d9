package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/consumer"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// jetStream makes a stream and a durable pull consumer of their own for
// the test (brokertest), deleted after.
func jetStream(t *testing.T) (js jetstream.JetStream, cons jetstream.Consumer, subject, url string) {
	t.Helper()
	_, js = brokertest.JetStream(t)
	s, subject := brokertest.Stream(t, js, "consumertest", 0)
	cons, err := s.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	return js, cons, subject, brokertest.NATSURL()
}

// orderEvent is a delivery as the relay hands it to the NATS transport.
func orderEvent(typ, customer string, orderID uuid.UUID, total int64) relay.Delivery {
	data, _ := json.Marshal(orderData(typ, customer, orderID, total))
	return relay.Delivery{EventID: uuid.Must(uuid.NewV7()), Type: typ, Data: data, CreatedAt: time.Now(),
		OrderingKey: orderID.String(), Header: http.Header{}}
}

// TestJetStreamEventsAreAppliedOnce runs the reference NATS consumer on a
// durable pull consumer fed by the relay's own NATS transport: a republish
// inside the stream's duplicate window is dropped by JetStream, one outside
// it (published again without the window's help) is caught by the inbox; a
// cancel that overtook its placement is refused until the placement is
// applied; a message that is not a CloudEvent is terminated, not retried.
func TestJetStreamEventsAreAppliedOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, newSecret(t))
	js, cons, subject, url := jetStream(t)
	publish := f.consumeNATS(t, cons, subject, url)

	placed := orderEvent("order.placed", "c-1", uuid.New(), 1000)
	publish(placed)
	publish(placed) // inside the duplicate window: JetStream drops it
	// The same event again as JetStream cannot recognise it: what a republish
	// after the window looks like to the stream. Its producer percent-encodes
	// more than the binding requires (any %XX decodes), so only decoding
	// gives the same id, type and time.
	again := nats.NewMsg(subject)
	again.Data = placed.Data
	encoded := strings.NewReplacer("-", "%2D", ".", "%2E", ":", "%3A")
	for _, h := range []string{"id", "type", "source", "time", "specversion"} {
		again.Header.Set("ce-"+h, encoded.Replace(map[string]string{"id": placed.EventID.String(), "type": placed.Type,
			"source": "urn:test:orders", "time": placed.CreatedAt.UTC().Format(time.RFC3339Nano), "specversion": "1.0"}[h]))
	}
	_, err := js.PublishMsg(context.Background(), again)
	require.NoError(t, err)

	order2 := uuid.New()
	publish(orderEvent("order.cancelled", "c-2", order2, 700)) // before its placement
	_, err = js.Publish(context.Background(), subject, []byte(`not a cloudevent`))
	require.NoError(t, err)
	within(t, 5*time.Second, func() bool { return f.stats(t).OutOfOrder >= 1 }, "the early cancel is refused")
	publish(orderEvent("order.placed", "c-2", order2, 700))

	// The refused cancel comes back after its NAK delay and applies.
	within(t, 20*time.Second, func() bool { return f.stats(t).Applied == 3 }, "placed, placed, cancelled applied")
	s := f.stats(t)
	require.EqualValues(t, 1, s.Duplicates, "the republish the stream did not catch is caught by the inbox")
	require.EqualValues(t, 1, s.BadRequest, "the unreadable message")
	require.EqualValues(t, 3, s.LedgerTotal, "each event applied once")
	within(t, 5*time.Second, func() bool {
		info, err := cons.Info(context.Background())
		require.NoError(t, err)
		return info.NumAckPending == 0 && info.NumPending == 0
	}, "every message settled: acked after commit, or terminated")
	c2, err := f.c.Customer(context.Background(), "c-2")
	require.NoError(t, err)
	require.EqualValues(t, 0, c2.BalanceCents, "placed then cancelled")
}

// consumeNATS runs f's consumer on cons until the test ends, and returns a
// function that publishes a delivery to subject through the relay's own
// NATS transport.
func (f *fixture) consumeNATS(t *testing.T, cons jetstream.Consumer, subject, url string) func(relay.Delivery) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.c.ConsumeNATS(ctx, cons) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "ConsumeNATS returns nil when its context ends")
	})
	pub := broker.NewNATS(url, "urn:test:orders")
	t.Cleanup(pub.Close)
	return func(d relay.Delivery) {
		t.Helper()
		d.URL = "nats:" + subject
		require.True(t, pub.Deliver(context.Background(), d).Acked)
	}
}

// within polls cond until it holds or d passes.
func within(t *testing.T, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An order.cancelled whose order.placed never comes (the destination was
// added after the order was placed, say) is redelivered with growing
// delays, then terminated and logged as an error: retried for ever, enough
// of them would fill the durable's MaxAckPending and stop every other
// delivery. Events behind it keep being applied meanwhile. The bound is
// shortened here (the test is about the bound); its default is
// natsOutOfOrderDeliveries.
func TestJetStreamCancelWhosePlacementNeverComesIsTerminated(t *testing.T) {
	t.Parallel()
	f := setup(t, newSecret(t))
	f.c.SetNATSRedelivery(20*time.Millisecond, 80*time.Millisecond, 4)
	_, cons, subject, url := jetStream(t)
	publish := f.consumeNATS(t, cons, subject, url)
	publish(orderEvent("order.cancelled", "c-1", uuid.New(), 500)) // its placement never comes
	publish(orderEvent("order.placed", "c-2", uuid.New(), 700))
	within(t, 10*time.Second, func() bool {
		info, err := cons.Info(context.Background())
		require.NoError(t, err)
		return info.NumAckPending == 0 && info.NumPending == 0
	}, "both settled: the placement acked, the orphan cancel terminated")
	s := f.stats(t)
	require.EqualValues(t, 1, s.Applied, "the placement")
	require.EqualValues(t, 4, s.OutOfOrder, "the cancel, delivered 4 times, then terminated")
	require.EqualValues(t, 1, s.LedgerTotal)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Contains(t, f.logs.String(), "JetStream event out of order too long: terminated")
}

// Durable keeps an existing durable's settings, refuses one that does not
// ack explicitly, and starts a new one at the time it is given: a durable
// created again on a stream that keeps more than the inbox remembers does
// not apply again what came before.
func TestDurableKeepsSettingsAndStartsWhereTheInboxRemembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := brokertest.JetStream(t)
	s, subject := brokertest.Stream(t, js, "durabletest", 0)
	stream := s.CachedInfo().Config.Name

	_, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "tuned", AckPolicy: jetstream.AckExplicitPolicy,
		MaxDeliver: 5, FilterSubject: subject, MaxAckPending: 20000})
	require.NoError(t, err)
	cons, err := consumer.Durable(ctx, js, stream, "tuned", time.Time{})
	require.NoError(t, err)
	cfg := cons.CachedInfo().Config
	require.Equal(t, 5, cfg.MaxDeliver, "the operator's settings survive a start")
	require.Equal(t, subject, cfg.FilterSubject)
	require.Equal(t, 20000, cfg.MaxAckPending)

	_, err = s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "noacks", AckPolicy: jetstream.AckNonePolicy})
	require.NoError(t, err)
	_, err = consumer.Durable(ctx, js, stream, "noacks", time.Time{})
	require.ErrorContains(t, err, "explicit acks")

	stored := func(body string) time.Time {
		ack, err := js.Publish(ctx, subject, []byte(body))
		require.NoError(t, err)
		m, err := s.GetMsg(ctx, ack.Sequence)
		require.NoError(t, err)
		return m.Time
	}
	first := stored("before")
	second := stored("after")
	require.True(t, second.After(first), "stored in order")
	read := func(c jetstream.Consumer) []string {
		batch, err := c.Fetch(10, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		var got []string
		for m := range batch.Messages() {
			got = append(got, string(m.Data()))
			require.NoError(t, m.Ack())
		}
		require.NoError(t, batch.Error())
		return got
	}
	fresh, err := consumer.Durable(ctx, js, stream, "fresh", second)
	require.NoError(t, err)
	require.Equal(t, []string{"after"}, read(fresh), "a new durable starts at the time given")
	all, err := consumer.Durable(ctx, js, stream, "all", time.Time{})
	require.NoError(t, err)
	require.Equal(t, []string{"before", "after"}, read(all), "with no time, at the stream's beginning")
}

// A database outage longer than the out-of-order bound does not cost a
// cancel: the deliveries the outage refused are not counted as out of
// order, so a cancel redelivered before its placement after the recovery
// waits for it as usual. Twenty orders, placed and cancelled, all refused
// by a database that rejects every inbox row, well past the bound; then the
// database recovers and every order ends at a zero balance, nothing
// terminated. The bounds are shortened (the test is about them).
func TestJetStreamOutageDoesNotCountAsOutOfOrder(t *testing.T) {
	t.Parallel()
	f := setup(t, newSecret(t))
	const bound = 6
	f.c.SetNATSRedelivery(20*time.Millisecond, 80*time.Millisecond, bound)
	_, err := f.pool.Exec(context.Background(), `ALTER TABLE consumer_inbox ADD CONSTRAINT outage CHECK (false) NOT VALID`)
	require.NoError(t, err)
	_, cons, subject, url := jetStream(t)
	publish := f.consumeNATS(t, cons, subject, url)
	const orders = 20
	var events []relay.Delivery
	for i := range orders {
		id := uuid.New()
		events = append(events, orderEvent("order.placed", fmt.Sprintf("c-%d", i), id, 100))
		events = append(events, orderEvent("order.cancelled", fmt.Sprintf("c-%d", i), id, 100))
	}
	for _, d := range events {
		publish(d)
	}
	within(t, 20*time.Second, func() bool { return f.stats(t).Errors >= 2*orders*(bound+2) },
		"every message refused by the outage more often than the bound, on average")
	_, err = f.pool.Exec(context.Background(), `ALTER TABLE consumer_inbox DROP CONSTRAINT outage`)
	require.NoError(t, err)

	within(t, 20*time.Second, func() bool { return f.stats(t).LedgerTotal == 2*orders }, "every placement and cancel applied")
	for i := range orders {
		c, err := f.c.Customer(context.Background(), fmt.Sprintf("c-%d", i))
		require.NoError(t, err)
		require.Zero(t, c.BalanceCents, "c-%d: placed and cancelled", i)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotContains(t, f.logs.String(), "terminated")
}

// A CloudEvent whose header names are not lowercase (Ce-Id, as another
// producer or a bridge may write them: the NATS binding reads names
// whatever their case) and whose time has a lowercase t and z (RFC 3339
// allows them) is applied. Both were terminated as "not a CloudEvent", and
// so lost.
func TestJetStreamReadsHeadersWhateverTheirCase(t *testing.T) {
	t.Parallel()
	f := setup(t, newSecret(t))
	js, cons, subject, url := jetStream(t)
	f.consumeNATS(t, cons, subject, url)
	placed := orderEvent("order.placed", "c-1", uuid.New(), 1000)
	m := nats.NewMsg(subject)
	m.Data = placed.Data
	m.Header.Set("Ce-Id", placed.EventID.String())
	m.Header.Set("Ce-Type", placed.Type)
	m.Header.Set("Ce-Source", "urn:test:orders")
	m.Header.Set("Ce-Specversion", "1.0")
	m.Header.Set("Ce-Time", strings.ToLower(placed.CreatedAt.UTC().Format(time.RFC3339Nano)))
	_, err := js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	within(t, 5*time.Second, func() bool { return f.stats(t).Applied == 1 }, "applied")
	require.Zero(t, f.stats(t).BadRequest)
}

// The JetStream consumer terminates such an event (redelivering it cannot
// help: it only gets older), counts and logs it, and applies nothing.
func TestJetStreamEventsOlderThanTheInboxRetentionAreTerminated(t *testing.T) {
	t.Parallel()
	f := setupWith(t, []consumer.Option{consumer.WithInboxRetention(inboxRetention)}, newSecret(t))
	_, cons, subject, url := jetStream(t)
	publish := f.consumeNATS(t, cons, subject, url)

	old := orderEvent(consumer.EventPlaced, "c-1", uuid.New(), 100)
	old.CreatedAt = time.Now().Add(-inboxRetention - time.Hour)
	publish(old)
	publish(orderEvent(consumer.EventPlaced, "c-2", uuid.New(), 100))
	within(t, 10*time.Second, func() bool { s := f.stats(t); return s.TooOld == 1 && s.Applied == 1 },
		"the old event is refused, the next one applied")
	within(t, 5*time.Second, func() bool {
		info, err := cons.Info(context.Background())
		require.NoError(t, err)
		return info.NumAckPending == 0 && info.NumPending == 0
	}, "the old event is terminated, not left to be redelivered")
	require.EqualValues(t, 1, f.stats(t).LedgerTotal, "nothing of the old event applied")
	f.mu.Lock()
	require.True(t, strings.Contains(f.logs.String(), old.EventID.String()), "the log names the refused event")
	f.mu.Unlock()
}
