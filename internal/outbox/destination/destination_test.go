package destination_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox/destination"
)

func TestDestinationSpecs(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		spec destination.Spec
		url  string
		err  string
	}{
		"webhook by default":    {spec: destination.Spec{URL: "https://example.com/hook"}, url: "https://example.com/hook"},
		"nats subject":          {spec: destination.Spec{Kind: "nats", Subject: "orders.events"}, url: "nats:orders.events"},
		"kafka topic":           {spec: destination.Spec{Kind: "kafka", Topic: "orders_v1-x"}, url: "kafka:orders_v1-x"},
		"rabbitmq exchange+key": {spec: destination.Spec{Kind: "rabbitmq", Exchange: "orders", RoutingKey: "order.placed"}, url: "rabbitmq:orders/order.placed"},
		"rabbitmq default ex":   {spec: destination.Spec{Kind: "rabbitmq", RoutingKey: "orders-queue"}, url: "rabbitmq:/orders-queue"},
		"unknown kind":          {spec: destination.Spec{Kind: "sqs", URL: "x"}, err: `unknown kind "sqs"`},
		"broker url as webhook": {spec: destination.Spec{URL: "kafka:orders"}, err: `register it with kind "kafka"`},
		"webhook without url":   {spec: destination.Spec{Kind: "webhook"}, err: "url is required"},
		"field of another kind": {spec: destination.Spec{Kind: "nats", Subject: "a.b", Topic: "t"}, err: "topic does not apply to a nats destination"},
		"url on a broker":       {spec: destination.Spec{Kind: "kafka", Topic: "t", URL: "kafka://evil:9092"}, err: "url does not apply"},
		"empty subject":         {spec: destination.Spec{Kind: "nats"}, err: "subject is empty"},
		"wildcard subject":      {spec: destination.Spec{Kind: "nats", Subject: "orders.>"}, err: "wildcard"},
		"empty token":           {spec: destination.Spec{Kind: "nats", Subject: "orders..x"}, err: "empty token"},
		"space in subject":      {spec: destination.Spec{Kind: "nats", Subject: "orders x"}, err: "whitespace"},
		"bad topic":             {spec: destination.Spec{Kind: "kafka", Topic: "orders/x"}, err: "Kafka topic"},
		"dot topic":             {spec: destination.Spec{Kind: "kafka", Topic: ".."}, err: "Kafka topic"},
		"long topic":            {spec: destination.Spec{Kind: "kafka", Topic: strings.Repeat("a", 250)}, err: "Kafka topic"},
		"bad exchange":          {spec: destination.Spec{Kind: "rabbitmq", Exchange: "a b", RoutingKey: "k"}, err: "RabbitMQ exchange"},
		"default ex, no queue":  {spec: destination.Spec{Kind: "rabbitmq"}, err: "cannot be empty"},
		"routing key over 255":  {spec: destination.Spec{Kind: "rabbitmq", Exchange: "x", RoutingKey: strings.Repeat("k", 256)}, err: "255 bytes"},
		// A destination is a place for events, never the broker's own API.
		"jetstream api":         {spec: destination.Spec{Kind: "nats", Subject: "$JS.API.STREAM.PURGE.ORDERS"}, err: "control surface"},
		"key-value store":       {spec: destination.Spec{Kind: "nats", Subject: "$KV.config.x"}, err: "control surface"},
		"system account":        {spec: destination.Spec{Kind: "nats", Subject: "$SYS.REQ.SERVER.PING"}, err: "control surface"},
		"reply inbox":           {spec: destination.Spec{Kind: "nats", Subject: "_INBOX.abc"}, err: "control surface"},
		"inbox prefix alone":    {spec: destination.Spec{Kind: "nats", Subject: "_INBOX"}, err: "control surface"},
		"subject like inbox":    {spec: destination.Spec{Kind: "nats", Subject: "_INBOXES.orders"}, url: "nats:_INBOXES.orders"},
		"consumer offsets":      {spec: destination.Spec{Kind: "kafka", Topic: "__consumer_offsets"}, err: "internal to Kafka"},
		"transaction state":     {spec: destination.Spec{Kind: "kafka", Topic: "__transaction_state"}, err: "internal to Kafka"},
		"any internal topic":    {spec: destination.Spec{Kind: "kafka", Topic: "__schemas"}, err: "internal to Kafka"},
		"one underscore topic":  {spec: destination.Spec{Kind: "kafka", Topic: "_orders"}, url: "kafka:_orders"},
		"rabbitmq event ex":     {spec: destination.Spec{Kind: "rabbitmq", Exchange: "amq.rabbitmq.event", RoutingKey: "k"}, err: "server's own"},
		"rabbitmq trace ex":     {spec: destination.Spec{Kind: "rabbitmq", Exchange: "amq.rabbitmq.trace", RoutingKey: "k"}, err: "server's own"},
		"rabbitmq reply-to":     {spec: destination.Spec{Kind: "rabbitmq", RoutingKey: "amq.rabbitmq.reply-to"}, err: "reply queue"},
		"rabbitmq server queue": {spec: destination.Spec{Kind: "rabbitmq", RoutingKey: "amq.gen-JzTY20BRgKO-HjmUJj0wLg"}, err: "server-named"},
		"rabbitmq amq.topic":    {spec: destination.Spec{Kind: "rabbitmq", Exchange: "amq.topic", RoutingKey: "orders.placed"}, url: "rabbitmq:amq.topic/orders.placed"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.spec.URLOf()
			if tc.err != "" {
				require.ErrorIs(t, err, destination.ErrInvalid)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.url, got)
			d, err := destination.Parse(got)
			require.NoError(t, err, "what URLOf writes, ParseDestination reads")
			kind := tc.spec.Kind
			if kind == "" {
				kind = destination.KindWebhook
			}
			require.Equal(t, kind, d.Kind)
		})
	}
}
