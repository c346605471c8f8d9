package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

func TestDestinationSpecs(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		spec outbox.DestinationSpec
		url  string
		err  string
	}{
		"webhook by default":    {spec: outbox.DestinationSpec{URL: "https://example.com/hook"}, url: "https://example.com/hook"},
		"nats subject":          {spec: outbox.DestinationSpec{Kind: "nats", Subject: "orders.events"}, url: "nats:orders.events"},
		"kafka topic":           {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "orders_v1-x"}, url: "kafka:orders_v1-x"},
		"rabbitmq exchange+key": {spec: outbox.DestinationSpec{Kind: "rabbitmq", Exchange: "orders", RoutingKey: "order.placed"}, url: "rabbitmq:orders/order.placed"},
		"rabbitmq default ex":   {spec: outbox.DestinationSpec{Kind: "rabbitmq", RoutingKey: "orders-queue"}, url: "rabbitmq:/orders-queue"},
		"unknown kind":          {spec: outbox.DestinationSpec{Kind: "sqs", URL: "x"}, err: `unknown kind "sqs"`},
		"broker url as webhook": {spec: outbox.DestinationSpec{URL: "kafka:orders"}, err: `register it with kind "kafka"`},
		"webhook without url":   {spec: outbox.DestinationSpec{Kind: "webhook"}, err: "url is required"},
		"field of another kind": {spec: outbox.DestinationSpec{Kind: "nats", Subject: "a.b", Topic: "t"}, err: "topic does not apply to a nats destination"},
		"url on a broker":       {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "t", URL: "kafka://evil:9092"}, err: "url does not apply"},
		"empty subject":         {spec: outbox.DestinationSpec{Kind: "nats"}, err: "subject is empty"},
		"wildcard subject":      {spec: outbox.DestinationSpec{Kind: "nats", Subject: "orders.>"}, err: "wildcard"},
		"empty token":           {spec: outbox.DestinationSpec{Kind: "nats", Subject: "orders..x"}, err: "empty token"},
		"space in subject":      {spec: outbox.DestinationSpec{Kind: "nats", Subject: "orders x"}, err: "whitespace"},
		"bad topic":             {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "orders/x"}, err: "Kafka topic"},
		"dot topic":             {spec: outbox.DestinationSpec{Kind: "kafka", Topic: ".."}, err: "Kafka topic"},
		"long topic":            {spec: outbox.DestinationSpec{Kind: "kafka", Topic: strings.Repeat("a", 250)}, err: "Kafka topic"},
		"bad exchange":          {spec: outbox.DestinationSpec{Kind: "rabbitmq", Exchange: "a b", RoutingKey: "k"}, err: "RabbitMQ exchange"},
		"default ex, no queue":  {spec: outbox.DestinationSpec{Kind: "rabbitmq"}, err: "cannot be empty"},
		"routing key over 255":  {spec: outbox.DestinationSpec{Kind: "rabbitmq", Exchange: "x", RoutingKey: strings.Repeat("k", 256)}, err: "255 bytes"},
		// A destination is a place for events, never the broker's own API.
		"jetstream api":         {spec: outbox.DestinationSpec{Kind: "nats", Subject: "$JS.API.STREAM.PURGE.ORDERS"}, err: "control surface"},
		"key-value store":       {spec: outbox.DestinationSpec{Kind: "nats", Subject: "$KV.config.x"}, err: "control surface"},
		"system account":        {spec: outbox.DestinationSpec{Kind: "nats", Subject: "$SYS.REQ.SERVER.PING"}, err: "control surface"},
		"reply inbox":           {spec: outbox.DestinationSpec{Kind: "nats", Subject: "_INBOX.abc"}, err: "control surface"},
		"inbox prefix alone":    {spec: outbox.DestinationSpec{Kind: "nats", Subject: "_INBOX"}, err: "control surface"},
		"subject like inbox":    {spec: outbox.DestinationSpec{Kind: "nats", Subject: "_INBOXES.orders"}, url: "nats:_INBOXES.orders"},
		"consumer offsets":      {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "__consumer_offsets"}, err: "internal to Kafka"},
		"transaction state":     {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "__transaction_state"}, err: "internal to Kafka"},
		"any internal topic":    {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "__schemas"}, err: "internal to Kafka"},
		"one underscore topic":  {spec: outbox.DestinationSpec{Kind: "kafka", Topic: "_orders"}, url: "kafka:_orders"},
		"rabbitmq event ex":     {spec: outbox.DestinationSpec{Kind: "rabbitmq", Exchange: "amq.rabbitmq.event", RoutingKey: "k"}, err: "server's own"},
		"rabbitmq trace ex":     {spec: outbox.DestinationSpec{Kind: "rabbitmq", Exchange: "amq.rabbitmq.trace", RoutingKey: "k"}, err: "server's own"},
		"rabbitmq reply-to":     {spec: outbox.DestinationSpec{Kind: "rabbitmq", RoutingKey: "amq.rabbitmq.reply-to"}, err: "reply queue"},
		"rabbitmq server queue": {spec: outbox.DestinationSpec{Kind: "rabbitmq", RoutingKey: "amq.gen-JzTY20BRgKO-HjmUJj0wLg"}, err: "server-named"},
		"rabbitmq amq.topic":    {spec: outbox.DestinationSpec{Kind: "rabbitmq", Exchange: "amq.topic", RoutingKey: "orders.placed"}, url: "rabbitmq:amq.topic/orders.placed"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.spec.URLOf()
			if tc.err != "" {
				require.ErrorIs(t, err, outbox.ErrInvalidDestination)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.url, got)
			d, err := outbox.ParseDestination(got)
			require.NoError(t, err, "what URLOf writes, ParseDestination reads")
			kind := tc.spec.Kind
			if kind == "" {
				kind = outbox.KindWebhook
			}
			require.Equal(t, kind, d.Kind)
		})
	}
}

// recorder is a Transport that keeps the URLs it was given.
type recorder struct{ urls []string }

func (r *recorder) Deliver(_ context.Context, d outbox.Delivery) outbox.Result {
	r.urls = append(r.urls, d.URL)
	return outbox.Result{Acked: true}
}

func TestRouterSendsByKind(t *testing.T) {
	t.Parallel()
	web, nats := &recorder{}, &recorder{}
	r := outbox.Router{outbox.KindWebhook: web, outbox.KindNATS: nats}
	ctx := context.Background()
	require.True(t, r.Deliver(ctx, outbox.Delivery{URL: "https://example.com/hook"}).Acked)
	require.True(t, r.Deliver(ctx, outbox.Delivery{URL: "nats:orders.events"}).Acked)
	require.Equal(t, []string{"https://example.com/hook"}, web.urls)
	require.Equal(t, []string{"nats:orders.events"}, nats.urls)

	res := r.Deliver(ctx, outbox.Delivery{URL: "kafka:orders"})
	require.ErrorContains(t, res.Err, "no kafka connection is configured on this worker",
		"a kind this worker has no broker for fails the attempt and says why")
}
