package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Kafka produces to Kafka topics with franz-go's idempotent producer and
// acks=all: a record is delivered once every in-sync replica has it, and
// the producer's own retries of one produce never write it twice. The
// record key is the event's ordering key, so one key's events land on one
// partition in order; the event id travels in the ce_id header for the
// consumer's inbox, since a second produce of the event (a relay retry after
// a lost ack) is a new record to Kafka.
//
// Each topic has a client of its own (destinations): a client sends one
// produce request per broker at a time, in order, under the context of its
// first record, so with one client for all a topic whose produce hangs (an
// acks=all waiting on a slow replica) held every other topic's records
// behind it, and a cancelled delivery could fail another topic's.
type Kafka struct {
	source string
	// schemas are the dataschema of each event type (Config.DataSchemas).
	schemas map[string]string
	clients *destinations[*kgo.Client]
}

// NewKafka returns a transport to the brokers of cfg. A topic's client
// connects at its first produce.
func NewKafka(cfg Config, source string) (*Kafka, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.KafkaBrokers...),
		kgo.ClientID("outbox-relay"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// The relay sends one message at a time per key, as soon as it is
		// claimed: there is nothing to batch by waiting.
		kgo.ProducerLinger(0),
		// A produce waits no longer than its delivery: without this the
		// idempotent producer waits for a hanging broker's answer past any
		// deadline, and the relay's request slot with it. A cancelled
		// produce may still have been written; the relay sends it again,
		// and the consumer's inbox drops the second copy, as for any
		// at-least-once delivery.
		kgo.AllowIdempotentProduceCancellation(),
	}
	if cfg.KafkaTLS {
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	if cfg.KafkaUser != "" {
		opts = append(opts, kgo.SASL(scram.Auth{User: cfg.KafkaUser, Pass: cfg.KafkaPassword}.AsSha512Mechanism()))
	}
	// Made once here so that options the client refuses fail the start,
	// not every produce; it connects to nothing.
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("creating the Kafka client: %w", err)
	}
	client.Close()
	open := func(string) *kgo.Client {
		c, _ := kgo.NewClient(opts...) // the options were checked above
		return c
	}
	return &Kafka{source: source, schemas: cfg.DataSchemas, clients: newDestinations(open, (*kgo.Client).Close)}, nil
}

// Deliver implements relay.Transport.
func (t *Kafka) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	dest := d.Target()
	rec := &kgo.Record{Topic: dest.Name, Value: d.Data}
	if d.OrderingKey != "" {
		rec.Key = []byte(d.OrderingKey)
	}
	ce, trace := attributes(d, t.source, t.schemas)
	// The Kafka binding's binary mode: attributes as ce_ headers.
	for _, a := range ce {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "ce_" + a.name, Value: []byte(a.value)})
	}
	for _, a := range trace {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: a.name, Value: []byte(a.value)})
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "content-type", Value: []byte(contentType)})
	client, release, err := t.clients.acquire(dest.Name)
	if err != nil {
		return relay.Result{Err: fmt.Errorf("producing to Kafka: %w", err)}
	}
	defer release()
	if err := client.ProduceSync(ctx, rec).FirstErr(); err != nil {
		// Too large for the producer or the topic: this message's fault.
		return relay.Result{Err: fmt.Errorf("producing to Kafka topic %q: %w", dest.Name, err),
			MessageFault: errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)}
	}
	return relay.Result{Acked: true}
}

// Close flushes nothing (every produce is synchronous) and closes the
// clients.
func (t *Kafka) Close() { t.clients.closeAll() }
