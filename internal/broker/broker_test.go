package broker_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// There is no Kafka server here: Kafka runs in process (franz-go's kfake),
// speaking the real protocol to the real client. NATS and RabbitMQ are the
// real servers (brokertest).
var (
	natsURL = brokertest.NATSURL
	amqpURL = brokertest.AMQPURL
)

const source = "urn:test:orders"

func delivery(t testing.TB, url, key string) relay.Delivery {
	t.Helper()
	return relay.Delivery{
		EventID: uuid.Must(uuid.NewV7()), MessageID: uuid.Must(uuid.NewV7()), Type: "order.placed", URL: url,
		Data: json.RawMessage(`{"id":"o-1","total_cents":1000}`), CreatedAt: time.Date(2026, 12, 1, 10, 0, 0, 5000, time.UTC),
		OrderingKey: key,
		Header:      http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// stream makes a JetStream stream of its own for the test, on a subject no
// other test uses, and deletes it after.
func stream(t *testing.T) (jetstream.Stream, string) {
	t.Helper()
	_, js := brokertest.JetStream(t)
	return brokertest.Stream(t, js, "outboxtest", time.Minute)
}

func TestNATSPublishesACloudEventOnceByEventID(t *testing.T) {
	t.Parallel()
	s, subject := stream(t)
	tr := broker.NewNATS(natsURL(), source)
	t.Cleanup(tr.Close)

	d := delivery(t, "nats:"+subject, "o-1")
	res := tr.Deliver(ctxT(t), d)
	require.NoError(t, res.Err)
	require.True(t, res.Acked, "delivered only on the stream's ack")
	// A relay retry after a lost ack publishes the event again: inside the
	// duplicate window the stream keeps one copy.
	require.True(t, tr.Deliver(ctxT(t), d).Acked)
	info, err := s.Info(ctxT(t))
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "Nats-Msg-Id = event id: the second publish is dropped as a duplicate")

	msg, err := s.GetMsg(ctxT(t), 1)
	require.NoError(t, err)
	require.JSONEq(t, string(d.Data), string(msg.Data), "the body is the event's data, as a webhook's data field")
	h := msg.Header
	require.Equal(t, d.EventID.String(), h.Get("Nats-Msg-Id"))
	require.Equal(t, d.EventID.String(), h.Get("ce-id"))
	require.Equal(t, "order.placed", h.Get("ce-type"))
	require.Equal(t, source, h.Get("ce-source"))
	require.Equal(t, "1.0", h.Get("ce-specversion"))
	require.Equal(t, "2026-12-01T10:00:00.000005Z", h.Get("ce-time"))
	require.Equal(t, "o-1", h.Get("ce-partitionkey"))
	require.Equal(t, "application/json", h.Get("content-type"))
	require.Equal(t, "application/json", h.Get("ce-datacontenttype"), "the NATS binding's name for the data's media type")
	require.Equal(t, d.Header.Get("traceparent"), h.Get("traceparent"), "the trace continues through the broker")
}

// A NATS header value is printable ASCII; the NATS binding percent-encodes
// an attribute's value (UTF-8) beyond it, and space, '"' and '%', as HTTP's
// binding does. An ordering key is whatever its module chose, and the
// source whatever the operator set.
func TestNATSPercentEncodesAttributesBeyondPrintableASCII(t *testing.T) {
	t.Parallel()
	s, subject := stream(t)
	src := "urn:shop:Zürich main"
	tr := broker.NewNATS(natsURL(), src)
	t.Cleanup(tr.Close)

	key := "Kunde \"Müller\" 100%\r\nNats-Msg-Id: forged"
	require.True(t, tr.Deliver(ctxT(t), delivery(t, "nats:"+subject, key)).Acked)
	msg, err := s.GetMsg(ctxT(t), 1)
	require.NoError(t, err)
	require.Equal(t, "Kunde%20%22M%C3%BCller%22%20100%25%0D%0ANats-Msg-Id:%20forged", msg.Header.Get("ce-partitionkey"))
	require.Equal(t, "urn:shop:Z%C3%BCrich%20main", msg.Header.Get("ce-source"))
	for _, got := range []string{msg.Header.Get("ce-partitionkey"), msg.Header.Get("ce-source")} {
		for _, c := range []byte(got) {
			require.True(t, c > ' ' && c < 0x7f, "%q: a header value is printable ASCII", got)
		}
	}
	decoded, err := url.PathUnescape(msg.Header.Get("ce-partitionkey"))
	require.NoError(t, err)
	require.Equal(t, key, decoded, "decoding gives the key back")
	require.Len(t, msg.Header.Values("Nats-Msg-Id"), 1)
	require.Equal(t, "order.placed", msg.Header.Get("ce-type"), "printable ASCII stays as it is")
}

// One stream may capture the subjects of two destinations of an event.
// JetStream deduplicates on Nats-Msg-Id per stream, so the second publish
// is acked as a duplicate and never stored on its subject: that must be a
// failed attempt naming the cause, not a delivery.
func TestNATSDuplicateOnAnotherSubjectIsAFailure(t *testing.T) {
	t.Parallel()
	_, js := brokertest.JetStream(t)
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	name, prefix := "OUTBOXTWO_"+id, "outboxtwo."+id
	s, err := brokertest.CreateStream(ctxT(t), js, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	tr := broker.NewNATS(natsURL(), source)
	t.Cleanup(tr.Close)

	billing := delivery(t, "nats:"+prefix+".billing", "o-1")
	require.True(t, tr.Deliver(ctxT(t), billing).Acked)
	audit := delivery(t, "nats:"+prefix+".audit", "o-1")
	audit.EventID = billing.EventID
	res := tr.Deliver(ctxT(t), audit)
	require.False(t, res.Acked, "the stream holds the event on billing's subject only: audit's copy was dropped")
	require.ErrorContains(t, res.Err, "one stream captures two destinations of the event")
	require.ErrorContains(t, res.Err, prefix+".billing")

	// A retry to the same subject is still the duplicate it should be.
	require.True(t, tr.Deliver(ctxT(t), billing).Acked)
	info, err := s.Info(ctxT(t))
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs)
}

func TestNATSFailuresAreClearErrors(t *testing.T) {
	t.Parallel()
	_, subject := stream(t)
	tr := broker.NewNATS(natsURL(), source)
	t.Cleanup(tr.Close)

	res := tr.Deliver(ctxT(t), delivery(t, "nats:"+subject+".nobody", ""))
	require.ErrorContains(t, res.Err, "no JetStream stream captures subject", "a subject no stream captures is a failed attempt")
	require.False(t, res.Acked)

	down := broker.NewNATS("nats://127.0.0.1:1", source)
	t.Cleanup(down.Close)
	res = down.Deliver(ctxT(t), delivery(t, "nats:"+subject, ""))
	require.ErrorContains(t, res.Err, "connecting to NATS", "a server that is down is a failed attempt, not a hang")
}

// queue declares a fresh exchange and a queue bound to it by key. The broker
// deletes both after the test (brokertest.QueueExpiry; the exchange goes
// with its last binding).
func queue(t testing.TB) (ch *amqp.Channel, exchange, key, q string) {
	t.Helper()
	ch, err := brokertest.RabbitMQ(t).Channel()
	require.NoError(t, err)
	id := uuid.NewString()
	exchange, key, q = "outboxtest-"+id, "order.placed", "outboxtest-q-"+id
	require.NoError(t, ch.ExchangeDeclare(exchange, "direct", false, true, false, false, nil))
	_, err = ch.QueueDeclare(q, false, true, false, false, brokertest.QueueExpiry)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q, key, exchange, false, nil))
	return ch, exchange, key, q
}

func TestRabbitMQPublishesConfirmedPersistentCloudEvents(t *testing.T) {
	t.Parallel()
	ch, exchange, key, q := queue(t)
	tr := broker.NewRabbitMQ(amqpURL(), source)
	t.Cleanup(tr.Close)

	d := delivery(t, "rabbitmq:"+exchange+"/"+key, "o-1")
	res := tr.Deliver(ctxT(t), d)
	require.NoError(t, res.Err)
	require.True(t, res.Acked, "delivered only on the publisher confirm")

	msg, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok, "the message is in the bound queue")
	require.JSONEq(t, string(d.Data), string(msg.Body))
	require.Equal(t, d.EventID.String(), msg.MessageId, "message-id = event id, the consumer's dedup key")
	require.Equal(t, amqp.Persistent, msg.DeliveryMode)
	require.Equal(t, "application/json", msg.ContentType)
	require.Equal(t, d.EventID.String(), msg.Headers["cloudEvents:id"])
	require.Equal(t, "order.placed", msg.Headers["cloudEvents:type"])
	require.Equal(t, source, msg.Headers["cloudEvents:source"])
	require.Equal(t, "1.0", msg.Headers["cloudEvents:specversion"])
	require.Equal(t, d.Header.Get("traceparent"), msg.Headers["traceparent"])
}

func TestRabbitMQUnroutableAndMissingExchangeFail(t *testing.T) {
	t.Parallel()
	ch, exchange, key, q := queue(t)
	tr := broker.NewRabbitMQ(amqpURL(), source)
	t.Cleanup(tr.Close)

	res := tr.Deliver(ctxT(t), delivery(t, "rabbitmq:"+exchange+"/no.queue.bound", ""))
	require.ErrorContains(t, res.Err, "unroutable", "mandatory: a message no queue takes is a failure, not a silent drop")
	require.False(t, res.Acked)

	res = tr.Deliver(ctxT(t), delivery(t, "rabbitmq:no-such-exchange-"+uuid.NewString()+"/"+key, ""))
	require.ErrorContains(t, res.Err, "NOT_FOUND", "a missing exchange names the broker's reason")

	// The failures cost the transport nothing: the next publish goes through.
	require.True(t, tr.Deliver(ctxT(t), delivery(t, "rabbitmq:"+exchange+"/"+key, "")).Acked)
	_, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)

	down := broker.NewRabbitMQ("amqp://guest:guest@127.0.0.1:1/", source)
	t.Cleanup(down.Close)
	require.ErrorContains(t, down.Deliver(ctxT(t), delivery(t, "rabbitmq:"+exchange+"/"+key, "")).Err, "connecting to RabbitMQ")
}

func kafkaCluster(t *testing.T, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, topics...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func TestKafkaProducesKeyedCloudEvents(t *testing.T) {
	t.Parallel()
	addrs := kafkaCluster(t, "orders")
	tr, err := broker.NewKafka(broker.Config{KafkaBrokers: addrs}, source)
	require.NoError(t, err)
	t.Cleanup(tr.Close)

	var sent []relay.Delivery
	for range 5 {
		d := delivery(t, "kafka:orders", "order-7")
		res := tr.Deliver(ctxT(t), d)
		require.NoError(t, res.Err)
		require.True(t, res.Acked, "delivered only on acks=all")
		sent = append(sent, d)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	var got []*kgo.Record
	for len(got) < len(sent) {
		fs := cl.PollFetches(ctxT(t))
		require.NoError(t, fs.Err0())
		got = append(got, fs.Records()...)
	}
	partition := got[0].Partition
	for i, r := range got {
		require.Equal(t, "order-7", string(r.Key), "the record key is the ordering key")
		require.Equal(t, partition, r.Partition, "one key, one partition")
		headers := map[string]string{}
		for _, h := range r.Headers {
			headers[h.Key] = string(h.Value)
		}
		require.Equal(t, sent[i].EventID.String(), headers["ce_id"], "in order, each with its event id")
		require.Equal(t, "order.placed", headers["ce_type"])
		require.Equal(t, source, headers["ce_source"])
		require.Equal(t, "1.0", headers["ce_specversion"])
		require.Equal(t, sent[i].Header.Get("traceparent"), headers["traceparent"])
		require.JSONEq(t, string(sent[i].Data), string(r.Value))
	}
}

func TestKafkaUnknownTopicFails(t *testing.T) {
	t.Parallel()
	tr, err := broker.NewKafka(broker.Config{KafkaBrokers: kafkaCluster(t, "orders")}, source)
	require.NoError(t, err)
	t.Cleanup(tr.Close)
	res := tr.Deliver(ctxT(t), delivery(t, "kafka:no-such-topic", ""))
	require.ErrorContains(t, res.Err, "UNKNOWN_TOPIC_OR_PARTITION")
	require.False(t, res.Acked)
}

// A message too large for the broker is its own fault, as a 413 is a
// webhook's: the result says so, and the relay does not back the
// destination off for it. The next message of the destination goes.
func TestBrokersSayAMessageTooLargeIsItsOwnFault(t *testing.T) {
	t.Parallel()
	big := delivery(t, "", "")
	big.Data = json.RawMessage(`"` + strings.Repeat("x", 2<<20) + `"`) // 2 MiB: over JetStream's and franz-go's 1 MiB

	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		_, js := brokertest.JetStream(t)
		id := strings.ReplaceAll(uuid.NewString(), "-", "")
		name, subject := "OUTBOXBIG_"+id, "outboxbig."+id
		_, err := brokertest.CreateStream(ctxT(t), js, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, MaxMsgSize: 1024})
		require.NoError(t, err)
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
		tr := broker.NewNATS(natsURL(), source)
		t.Cleanup(tr.Close)

		over := delivery(t, "nats:"+subject, "") // over the stream's 1 KiB
		over.Data = json.RawMessage(`"` + strings.Repeat("x", 2048) + `"`)
		res := tr.Deliver(ctxT(t), over)
		require.Error(t, res.Err)
		require.True(t, res.MessageFault, "too large for the stream: %v", res.Err)
		d := big
		d.URL = "nats:" + subject
		res = tr.Deliver(ctxT(t), d)
		require.Error(t, res.Err)
		require.True(t, res.MessageFault, "too large for the server: %v", res.Err)
		require.True(t, tr.Deliver(ctxT(t), delivery(t, "nats:"+subject, "")).Acked, "the next message goes")

		_, other := stream(t)
		res = tr.Deliver(ctxT(t), delivery(t, "nats:"+other+".nobody", ""))
		require.False(t, res.MessageFault, "a subject no stream captures is the destination's trouble: %v", res.Err)
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		tr, err := broker.NewKafka(broker.Config{KafkaBrokers: kafkaCluster(t, "orders")}, source)
		require.NoError(t, err)
		t.Cleanup(tr.Close)
		d := big
		d.URL = "kafka:orders"
		res := tr.Deliver(ctxT(t), d)
		require.Error(t, res.Err)
		require.True(t, res.MessageFault, "too large for the producer: %v", res.Err)
		require.True(t, tr.Deliver(ctxT(t), delivery(t, "kafka:orders", "")).Acked, "the next message goes")
	})
	t.Run("rabbitmq", func(t *testing.T) {
		t.Parallel()
		_, exchange, key, _ := queue(t)
		tr := broker.NewRabbitMQ(amqpURL(), source)
		t.Cleanup(tr.Close)
		dest := "rabbitmq:" + exchange + "/" + key
		// One byte over RabbitMQ's max_message_size at its default (128
		// MiB), which a test cannot lower on a shared server: the broker
		// closes the channel with 406 PRECONDITION_FAILED.
		over := delivery(t, dest, "")
		over.Data = json.RawMessage(`"` + strings.Repeat("x", rabbitMQMaxMessageSize-1) + `"`)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res := tr.Deliver(ctx, over)
		require.ErrorContains(t, res.Err, "PRECONDITION_FAILED")
		require.True(t, res.MessageFault, "406 for a message over max_message_size is this message's fault: %v", res.Err)
		require.True(t, tr.Deliver(ctxT(t), delivery(t, dest, "")).Acked, "the next message goes")
		res = tr.Deliver(ctxT(t), delivery(t, "rabbitmq:"+exchange+"/no.queue.bound", ""))
		require.False(t, res.MessageFault, "an unroutable message is the destination's trouble: %v", res.Err)
	})
}

// rabbitMQMaxMessageSize is RabbitMQ's max_message_size at its default
// (128 MiB, since 3.8).
const rabbitMQMaxMessageSize = 128 << 20

// A work-queue stream deletes a message once its consumer acks it: a
// republish of the event within the duplicate window (the relay's retry
// after a lost ack) is still a delivery, though the stream no longer holds
// the message the duplicate ack points at.
func TestNATSDuplicateOfAConsumedMessageIsDelivered(t *testing.T) {
	t.Parallel()
	_, js := brokertest.JetStream(t)
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	name, subject := "OUTBOXWQ_"+id, "outboxwq."+id
	s, err := brokertest.CreateStream(ctxT(t), js, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
		Retention: jetstream.WorkQueuePolicy, Duplicates: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	tr := broker.NewNATS(natsURL(), source)
	t.Cleanup(tr.Close)

	d := delivery(t, "nats:"+subject, "")
	require.True(t, tr.Deliver(ctxT(t), d).Acked)
	c, err := s.CreateConsumer(ctxT(t), jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	consumeOne(t, s, c)

	res := tr.Deliver(ctxT(t), d)
	require.NoError(t, res.Err)
	require.True(t, res.Acked, "the duplicate of a consumed message is delivered")
}

// A work-queue stream serving two destinations of an event (billing and
// audit, a consumer filtered on each): billing's consumer takes its copy,
// the stream deletes it, and audit's publish is then acked as a duplicate
// of a message the stream no longer holds. That is a failed attempt, not a
// delivery: nothing reached audit. Recorded delivered, the event was lost.
func TestNATSDuplicateOfAGoneMessageOnAnotherSubjectIsAFailure(t *testing.T) {
	t.Parallel()
	_, js := brokertest.JetStream(t)
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	name, prefix := "OUTBOXWQ2_"+id, "outboxwq2."+id
	s, err := brokertest.CreateStream(ctxT(t), js, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"},
		Retention: jetstream.WorkQueuePolicy, Duplicates: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	billing, err := s.CreateConsumer(ctxT(t), jetstream.ConsumerConfig{Durable: "billing", FilterSubject: prefix + ".billing",
		AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	audit, err := s.CreateConsumer(ctxT(t), jetstream.ConsumerConfig{Durable: "audit", FilterSubject: prefix + ".audit",
		AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	tr := broker.NewNATS(natsURL(), source)
	t.Cleanup(tr.Close)

	toBilling := delivery(t, "nats:"+prefix+".billing", "o-1")
	require.True(t, tr.Deliver(ctxT(t), toBilling).Acked)
	consumeOne(t, s, billing)

	toAudit := delivery(t, "nats:"+prefix+".audit", "o-1")
	toAudit.EventID = toBilling.EventID
	res := tr.Deliver(ctxT(t), toAudit)
	info, err := audit.Info(ctxT(t))
	require.NoError(t, err)
	require.Zero(t, info.NumPending, "nothing reached audit")
	require.False(t, res.Acked, "so the publish is not a delivery")
	require.ErrorContains(t, res.Err, "no longer holds")
}

// consumeOne takes and acks one message of the work-queue stream s through
// c, and waits until the stream has deleted it.
func consumeOne(t *testing.T, s jetstream.Stream, c jetstream.Consumer) {
	t.Helper()
	msgs, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	for m := range msgs.Messages() {
		require.NoError(t, m.DoubleAck(ctxT(t)))
	}
	require.Eventually(t, func() bool {
		info, err := s.Info(ctxT(t))
		return err == nil && info.State.Msgs == 0
	}, 5*time.Second, 10*time.Millisecond, "the work queue deleted the acked message")
}
