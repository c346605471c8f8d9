package broker_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/orders/internal/broker"
)

// Each broker's CloudEvent names its data's schema (dataschema, as each
// binding names it): the URI of its type's schema in the event catalog,
// which the worker gives Transports. A type without one goes without.
func TestBrokerEventsNameTheirDataSchema(t *testing.T) {
	t.Parallel()
	const uri = "urn:test:orders:events:order.placed:v1"
	addrs := kafkaCluster(t, "orders")
	ts, closeAll, err := broker.Transports(broker.Config{NATSURL: natsURL(), AMQPURL: amqpURL(), KafkaBrokers: addrs,
		Source: source, DataSchemas: map[string]string{"order.placed": uri}})
	require.NoError(t, err)
	t.Cleanup(closeAll)

	s, subject := stream(t)
	d := delivery(t, "nats:"+subject, "o-1")
	require.NoError(t, ts["nats"].Deliver(ctxT(t), d).Err)
	untyped := delivery(t, "nats:"+subject, "o-1")
	untyped.Type = "order.unknown"
	require.NoError(t, ts["nats"].Deliver(ctxT(t), untyped).Err)
	msg, err := s.GetMsg(ctxT(t), 1)
	require.NoError(t, err)
	require.Equal(t, uri, msg.Header.Get("ce-dataschema"), "NATS: ce-dataschema")
	msg, err = s.GetMsg(ctxT(t), 2)
	require.NoError(t, err)
	require.Empty(t, msg.Header.Values("ce-dataschema"), "a type the catalog lacks is sent without a dataschema")

	ch, exchange, key, q := queue(t)
	require.NoError(t, ts["rabbitmq"].Deliver(ctxT(t), delivery(t, "rabbitmq:"+exchange+"/"+key, "o-1")).Err)
	got, ok, err := ch.Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, uri, got.Headers["cloudEvents:dataschema"], "RabbitMQ: cloudEvents:dataschema")

	require.NoError(t, ts["kafka"].Deliver(ctxT(t), delivery(t, "kafka:orders", "o-1")).Err)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	fs := cl.PollFetches(ctxT(t))
	require.NoError(t, fs.Err0())
	headers := map[string]string{}
	for _, h := range fs.Records()[0].Headers {
		headers[h.Key] = string(h.Value)
	}
	require.Equal(t, uri, headers["ce_dataschema"], "Kafka: ce_dataschema")
}
