package relayworker

import (
	"errors"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/process"
)

// Broker destinations: their settings, and their transports beside the
// webhooks'. A service made without them (./task new:service -without
// brokers) has no such file, nor the lines marked "brokers" elsewhere: its
// worker delivers webhooks only.

// defaultBrokers is the brokers' configuration before the environment: no
// broker, and the service's own CloudEvents source (new:service names it
// after the copy).
var defaultBrokers = broker.Config{Source: "urn:outboxkit:orders"}

// brokerSettings are the settings of broker destinations, with a table of
// their own in docs/reference.md.
var brokerSettings = []setting{
	{"OUTBOX_NATS_URL", "",
		"NATS servers for `nats` destinations (`nats://user:pass@host:4222`, `tls://` for TLS; comma-separated for a cluster). Unset: `nats` destinations fail and back off (docs/brokers.md)",
		func(c *config) any { return &c.brokers.NATSURL }},
	{"OUTBOX_KAFKA_BROKERS", "",
		"comma-separated seed brokers (`host:port`) for `kafka` destinations",
		func(c *config) any { return &c.brokers.KafkaBrokers }},
	{"OUTBOX_KAFKA_TLS", "",
		"`true`: dial the Kafka brokers with TLS (the system's roots)",
		func(c *config) any { return &c.brokers.KafkaTLS }},
	{"OUTBOX_KAFKA_USER", "",
		"with `OUTBOX_KAFKA_PASSWORD`: SASL SCRAM-SHA-512 credentials for Kafka",
		func(c *config) any { return &c.brokers.KafkaUser }},
	{"OUTBOX_KAFKA_PASSWORD", "",
		"the SASL password (never logged)",
		func(c *config) any { return &c.brokers.KafkaPassword }},
	{"OUTBOX_AMQP_URL", "",
		"RabbitMQ for `rabbitmq` destinations (`amqp://user:pass@host:5672/vhost`, `amqps://` for TLS)",
		func(c *config) any { return &c.brokers.AMQPURL }},
	{"OUTBOX_EVENT_SOURCE", "",
		"the CloudEvents `source` of events published to brokers",
		func(c *config) any { return &c.brokers.Source }},
}

// validateBrokers checks the brokers' settings together, naming each
// problem's variable.
func validateBrokers(env *process.Env, c broker.Config) {
	if (c.KafkaUser == "") != (c.KafkaPassword == "") {
		env.Fail("OUTBOX_KAFKA_PASSWORD", errors.New("set OUTBOX_KAFKA_USER and OUTBOX_KAFKA_PASSWORD together"))
	}
	if err := broker.CheckNATSURL(c.NATSURL); err != nil {
		env.Fail("OUTBOX_NATS_URL", err)
	}
	if err := broker.CheckAMQPURL(c.AMQPURL); err != nil {
		env.Fail("OUTBOX_AMQP_URL", err)
	}
	if c.Source == "" {
		env.Fail("OUTBOX_EVENT_SOURCE", errors.New("must not be empty: it is every broker event's CloudEvents source"))
	}
}

// addBrokers adds a transport to router for each broker c configures, and
// returns what closes them.
func addBrokers(router relay.Router, c broker.Config) (closeAll func(), err error) {
	transports, closeAll, err := broker.Transports(c)
	if err != nil {
		return nil, err
	}
	for kind, t := range transports {
		router[kind] = t
	}
	return closeAll, nil
}
