// Package broker publishes outbox messages to message brokers: NATS
// JetStream, Kafka and RabbitMQ. Each transport implements relay.Transport,
// so broker destinations share the relay's claim, per-destination
// scheduling, backoff, circuit breaker, history and metrics with webhooks.
//
// Every transport publishes one message per delivery and returns only when
// the broker has acknowledged it (JetStream's ack, Kafka's acks=all,
// RabbitMQ's publisher confirm), so a message is marked delivered only once
// it is stored. Each also gives the broker the event id for its own
// deduplication; that never replaces the consumer's inbox (see
// docs/brokers.md).
//
// The message is a CloudEvent in binary mode: the event's JSON payload (the
// webhook body's data) as the message body, and its attributes (id, type,
// source, time, specversion, and dataschema, its type's schema in the event
// catalog) plus the W3C traceparent in the headers, named
// as each broker's CloudEvents binding names them.
package broker

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Config is where the brokers are. Addresses and credentials come from the
// operator's configuration only; an endpoint names just a subject, topic or
// exchange on them. An empty address leaves that kind unconfigured: its
// destinations fail with an error saying so, and back off alone.
type Config struct {
	// NATSURL is a NATS server URL list (nats://user:pass@host:4222, tls://
	// for TLS), as nats.Connect takes it.
	NATSURL string
	// KafkaBrokers are the seed brokers, host:port.
	KafkaBrokers []string
	// KafkaTLS dials the Kafka brokers with TLS (the system's roots).
	KafkaTLS bool
	// KafkaUser and KafkaPassword, when set, authenticate with SASL
	// SCRAM-SHA-512.
	KafkaUser, KafkaPassword string
	// AMQPURL is a RabbitMQ URL (amqp://user:pass@host:5672/vhost, amqps://
	// for TLS).
	AMQPURL string
	// Source is the CloudEvents source attribute of every event.
	Source string
	// DataSchemas are the CloudEvents dataschema of each event type: its
	// schema's URI in the event catalog (outbox.EventType.SchemaID), a
	// new one for each version. A type without one is sent without it.
	DataSchemas map[string]string
}

// Transports opens a transport for each configured broker and returns them
// by kind, ready to add to an relay.Router. Connections are made at the
// first publish, so a broker that is down at start delays nothing but its
// own destinations. close closes them all.
func Transports(cfg Config) (ts map[string]relay.Transport, close func(), err error) {
	if err := CheckNATSURL(cfg.NATSURL); err != nil {
		return nil, nil, fmt.Errorf("checking the NATS URL: %w", err)
	}
	if err := CheckAMQPURL(cfg.AMQPURL); err != nil {
		return nil, nil, fmt.Errorf("checking the RabbitMQ URL: %w", err)
	}
	ts = map[string]relay.Transport{}
	var closers []func()
	if cfg.NATSURL != "" {
		t := NewNATS(cfg.NATSURL, cfg.Source)
		t.schemas = cfg.DataSchemas
		ts[destination.KindNATS], closers = t, append(closers, t.Close)
	}
	if len(cfg.KafkaBrokers) > 0 {
		t, err := NewKafka(cfg, cfg.Source)
		if err != nil {
			return nil, nil, err
		}
		ts[destination.KindKafka], closers = t, append(closers, t.Close)
	}
	if cfg.AMQPURL != "" {
		t := NewRabbitMQ(cfg.AMQPURL, cfg.Source)
		t.schemas = cfg.DataSchemas
		ts[destination.KindRabbitMQ], closers = t, append(closers, t.Close)
	}
	return ts, func() {
		for _, c := range closers {
			c()
		}
	}, nil
}

// errBadURL replaces an error that would quote a broker URL.
var errBadURL = errors.New("the URL does not parse (it is not shown: it may hold a password; " +
	"percent-encode special characters in its user and password)")

// hideURL keeps a broker URL out of an error: url.Parse's errors quote the
// whole string, password included, and a delivery's error is stored in the
// attempt history and logged.
func hideURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errBadURL
	}
	return err
}

// CheckNATSURL reports whether raw, a comma-separated list of NATS server
// URLs as NATSURL holds it, parses, without quoting it. Empty is fine: no
// NATS configured.
func CheckNATSURL(raw string) error {
	if raw == "" {
		return nil
	}
	for _, u := range strings.Split(raw, ",") {
		u = strings.TrimSpace(u)
		if !strings.Contains(u, "://") {
			u = "nats://" + u // as nats.Connect reads a bare host:port
		}
		if _, err := url.Parse(u); err != nil {
			return errBadURL
		}
	}
	return nil
}

// CheckAMQPURL reports whether raw, an AMQPURL, is a RabbitMQ URL, without
// quoting it. Empty is fine: no RabbitMQ configured.
func CheckAMQPURL(raw string) error {
	if raw == "" {
		return nil
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return hideURL(err)
	}
	return nil
}

// attribute is one CloudEvents context attribute of a delivery.
type attribute struct{ name, value string }

// attributes are the event's CloudEvents attributes, unprefixed, and the
// trace context headers, which every binding carries as they are. schemas
// give the dataschema of the event's type, when it has one.
func attributes(d relay.Delivery, source string, schemas map[string]string) (ce []attribute, trace []attribute) {
	ce = []attribute{
		{"specversion", "1.0"},
		{"id", d.EventID.String()},
		{"type", d.Type},
		{"source", source},
		{"time", d.CreatedAt.UTC().Format(time.RFC3339Nano)},
	}
	if uri := schemas[d.Type]; uri != "" {
		ce = append(ce, attribute{"dataschema", uri})
	}
	if d.OrderingKey != "" {
		// The partitioning extension: the key whose events stay in order.
		ce = append(ce, attribute{"partitionkey", d.OrderingKey})
	}
	for _, h := range []string{"traceparent", "tracestate"} {
		if v := d.Header.Get(h); v != "" {
			trace = append(trace, attribute{h, v})
		}
	}
	return ce, trace
}

// percentEncode writes an attribute's value for a binding whose header
// values must be printable ASCII, NATS's as HTTP's: every byte of its UTF-8
// outside U+0021 to U+007E, and '"' and '%', becomes %XX (upper-case hex),
// as the CloudEvents HTTP binding prescribes and its NATS binding adopts.
// Without it a key with a line break would be cut or rewritten by the
// client's header encoding, and one beyond ASCII sent as the server does
// not promise to carry it.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c > ' ' && c < 0x7f && c != '"' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// contentType is the body's media type, the CloudEvents datacontenttype.
const contentType = "application/json"

// awaitDial waits for a transport's dial in progress to end, or for ctx:
// a publish waits for a connection no longer than its own deadline, while
// the dial goes on for the publishes after it.
func awaitDial(ctx context.Context, dialing <-chan struct{}, broker string) error {
	select {
	case <-dialing:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("connecting to %s: %w", broker, ctx.Err())
	}
}

// failedDial remembers a dial that failed, for redialAfter: the publishes
// that waited for it (they share one dial) fail at once
// with its error instead of each dialing in turn, which against a broker
// that drops packets took a dial timeout apiece, one after another. Guarded
// by its transport's lock.
type failedDial struct {
	err error
	at  time.Time
}

// redialAfter is how long a failed dial answers for the next ones.
const redialAfter = time.Second

func (f *failedDial) recent() error {
	if f.err != nil && time.Since(f.at) < redialAfter {
		return f.err
	}
	return nil
}

func (f *failedDial) set(err error) error {
	f.err, f.at = err, time.Now()
	return err
}
