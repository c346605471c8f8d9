package relayworker_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/dbtest"
)

// brokers is one JetStream stream, one RabbitMQ queue and one in-process
// Kafka cluster (kfake: there is no Kafka server here) of the test's own.
type brokers struct {
	natsURL, subject string
	stream           jetstream.Stream
	amqpURL, queue   string
	exchange         string
	ch               *amqp.Channel
	kafka            []string
}

func newBrokers(t *testing.T) *brokers {
	t.Helper()
	b := &brokers{}
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	_, js := brokertest.JetStream(t)
	b.natsURL = brokertest.NATSURL()
	b.stream, b.subject = brokertest.Stream(t, js, "relayworkertest", 0)

	b.amqpURL = brokertest.AMQPURL()
	var err error
	b.ch, err = brokertest.RabbitMQ(t).Channel()
	require.NoError(t, err)
	b.exchange, b.queue = "relayworkertest-"+id, "relayworkertest-q-"+id
	require.NoError(t, b.ch.ExchangeDeclare(b.exchange, "topic", false, true, false, false, nil))
	_, err = b.ch.QueueDeclare(b.queue, false, true, false, false, brokertest.QueueExpiry)
	require.NoError(t, err)
	require.NoError(t, b.ch.QueueBind(b.queue, "order.#", b.exchange, false, nil))

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	b.kafka = cluster.ListenAddrs()
	return b
}

// brokerEvent is what one broker holds of an event.
type brokerEvent struct{ id, typ, key string }

func (b *brokers) natsEvents(t *testing.T) []brokerEvent {
	t.Helper()
	info, err := b.stream.Info(context.Background())
	require.NoError(t, err)
	var out []brokerEvent
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := b.stream.GetMsg(context.Background(), seq)
		require.NoError(t, err)
		out = append(out, brokerEvent{m.Header.Get("ce-id"), m.Header.Get("ce-type"), m.Header.Get("ce-partitionkey")})
	}
	return out
}

func (b *brokers) rabbitEvents(t *testing.T, n int) []brokerEvent {
	t.Helper()
	var out []brokerEvent
	require.Eventually(t, func() bool {
		m, ok, err := b.ch.Get(b.queue, true)
		if err == nil && ok {
			out = append(out, brokerEvent{m.MessageId, m.Type, m.Headers["cloudEvents:partitionkey"].(string)})
		}
		return len(out) == n
	}, 10*time.Second, 10*time.Millisecond, "RabbitMQ holds %d messages", n)
	return out
}

func (b *brokers) kafkaEvents(t *testing.T, n int) []brokerEvent {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.kafka...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var out []brokerEvent
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, fs.Err0(), "Kafka holds %d records", n)
		for _, r := range fs.Records() {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			out = append(out, brokerEvent{h["ce_id"], h["ce_type"], string(r.Key)})
		}
	}
	return out
}

// An order's events reach a JetStream subject, a RabbitMQ exchange and a
// Kafka topic registered through the admin API, each as a CloudEvent with
// the event's id, in the order's order; the broker addresses come from the
// worker's environment only.
func TestBrokerDestinations(t *testing.T) {
	t.Parallel()
	b := newBrokers(t)
	dbURL := dbtest.URL(t)
	api := startAPI(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken})
	env := relayEnv(dbURL)
	env["OUTBOX_NATS_URL"], env["OUTBOX_AMQP_URL"], env["OUTBOX_KAFKA_BROKERS"] = b.natsURL, b.amqpURL, strings.Join(b.kafka, ",")
	startWorker(t, env)

	types := `"event_types":["order.placed","order.cancelled"]`
	for _, dest := range []string{
		`"kind":"nats","subject":"` + b.subject + `"`,
		`"kind":"rabbitmq","exchange":"` + b.exchange + `","routing_key":"order.events"`,
		`"kind":"kafka","topic":"orders"`,
	} {
		var ep struct{ Kind, URL string }
		require.Equal(t, http.StatusCreated, api.admin(t, http.MethodPost, "/webhook-endpoints", `{`+dest+`,`+types+`}`, &ep), dest)
		require.NotEqual(t, "webhook", ep.Kind)
	}
	// Bad destinations: a clear 422, and nothing written.
	for bad, why := range map[string]string{
		`"kind":"sqs","url":"x"`:                                         `unknown kind \"sqs\"`,
		`"kind":"nats","subject":"orders.>"`:                             `NATS subject \"orders.\u003e\" has a wildcard`,
		`"kind":"kafka","topic":"orders","url":"kafka://elsewhere:9092"`: `url does not apply to a kafka destination`,
		`"kind":"rabbitmq","exchange":"a b","routing_key":"k"`:           `RabbitMQ exchange \"a b\" must be`,
		`"url":"nats:orders"`:                                            `is a nats destination: register it with kind \"nats\"`,
	} {
		code, body := api.call(t, http.MethodPost, "/webhook-endpoints", "Bearer "+adminToken, `{`+bad+`,`+types+`}`)
		require.Equal(t, http.StatusUnprocessableEntity, code, "%s: %s", bad, body)
		require.Contains(t, string(body), why, "%s: the problem names what is wrong", bad)
	}
	var eps []struct{ Kind, URL string }
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodGet, "/webhook-endpoints", "", &eps))
	require.Len(t, eps, 3, "refused destinations wrote nothing")

	var o struct{ ID string }
	code, body := api.call(t, http.MethodPost, "/orders", "", `{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)
	require.NoError(t, json.Unmarshal(body, &o))
	code, body = api.call(t, http.MethodPost, "/orders/"+o.ID+"/cancel", "", "")
	require.Equal(t, http.StatusOK, code, "body: %s", body)
	require.Eventually(t, func() bool {
		var s stats
		code, err := api.tryAdmin(http.MethodGet, "/outbox/stats", "", &s)
		return err == nil && code == http.StatusOK && s.Delivered == 6 && s.Pending == 0
	}, 20*time.Second, 20*time.Millisecond,
		"two events to three brokers, each acknowledged")

	natsGot, rabbitGot, kafkaGot := b.natsEvents(t), b.rabbitEvents(t, 2), b.kafkaEvents(t, 2)
	require.Len(t, natsGot, 2)
	require.Equal(t, []string{"order.placed", "order.cancelled"}, []string{natsGot[0].typ, natsGot[1].typ}, "in the order's order")
	for i := range natsGot {
		require.Equal(t, o.ID, natsGot[i].key, "keyed by the order")
		require.Equal(t, natsGot[i], rabbitGot[i], "one event id on every broker")
		require.Equal(t, natsGot[i], kafkaGot[i], "one event id on every broker; the Kafka record key is the order id")
	}
}

// A broker that is down is a destination that fails: it backs off alone,
// at the defaults, while a webhook endpoint beside it gets every order, and
// its messages wait without failing.
func TestDownBrokerBacksOffAlone(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	rec := newReceiver(t)
	api := startAPI(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	startWorker(t, map[string]string{"DATABASE_URL": dbURL, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true",
		"OUTBOX_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/"}) // nothing listens there
	var down struct{ ID string }
	require.Equal(t, http.StatusCreated, api.admin(t, http.MethodPost, "/webhook-endpoints",
		`{"kind":"rabbitmq","exchange":"orders","routing_key":"placed","event_types":["order.placed"]}`, &down))
	register(t, api, rec, "order.placed")

	const n = 20
	for range n {
		code, body := api.call(t, http.MethodPost, "/orders", "", `{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
		require.Equal(t, http.StatusCreated, code, "body: %s", body)
	}
	require.Eventually(t, func() bool { return len(delivered(rec)) == n }, 20*time.Second, 20*time.Millisecond,
		"the webhook endpoint gets every order while the broker is down")
	var ep struct {
		State       string     `json:"state"`
		StateReason string     `json:"state_reason"`
		NextProbeAt *time.Time `json:"next_probe_at"`
	}
	require.Eventually(t, func() bool {
		code, err := api.tryAdmin(http.MethodGet, "/webhook-endpoints/"+down.ID, "", &ep)
		return err == nil && code == http.StatusOK && ep.State == "backing_off"
	}, 20*time.Second, 20*time.Millisecond, "the broker destination backs off as a whole")
	require.Contains(t, ep.StateReason, "connecting to RabbitMQ", "its state says why")
	require.NotNil(t, ep.NextProbeAt)
	var s stats
	require.Eventually(t, func() bool {
		code, err := api.tryAdmin(http.MethodGet, "/outbox/stats", "", &s)
		return err == nil && code == http.StatusOK && s.Delivered == n
	}, 10*time.Second, 20*time.Millisecond,
		"the webhook deliveries recorded")
	require.Zero(t, s.Failed, "waiting behind an open circuit fails nothing")
	require.EqualValues(t, n, s.Pending+s.Claimed, "the broker's messages wait")
}

// A destination names a place for events, never the broker's control
// surface: the admin API refuses the JetStream API, Kafka's internal topics
// and RabbitMQ's own exchanges at create and at PATCH, and a row stored
// before the rule (written here by hand) is never published to: the stream
// whose purge subject it names keeps its messages.
func TestDestinationsNeverNameTheBrokersOwnAPI(t *testing.T) {
	t.Parallel()
	b := newBrokers(t)
	nc, js := brokertest.JetStream(t)
	ctx := context.Background()
	for i := range 3 {
		_, err := js.Publish(ctx, b.subject, []byte{byte('0' + i)})
		require.NoError(t, err)
	}
	info, err := b.stream.Info(ctx)
	require.NoError(t, err)
	purge := "$JS.API.STREAM.PURGE." + info.Config.Name

	dbURL := dbtest.URL(t)
	api := startAPI(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken})
	types := `"event_types":["order.placed"]`
	var ok struct{ ID string }
	require.Equal(t, http.StatusCreated, api.admin(t, http.MethodPost, "/webhook-endpoints",
		`{"kind":"nats","subject":"`+b.subject+`",`+types+`}`, &ok))
	for _, bad := range []string{
		`"kind":"nats","subject":"` + purge + `"`,
		`"kind":"nats","subject":"$KV.config.x"`,
		`"kind":"nats","subject":"_INBOX.abc"`,
		`"kind":"kafka","topic":"__consumer_offsets"`,
		`"kind":"rabbitmq","exchange":"amq.rabbitmq.event","routing_key":"x"`,
	} {
		code, body := api.call(t, http.MethodPost, "/webhook-endpoints", "Bearer "+adminToken, `{`+bad+`,`+types+`}`)
		require.Equal(t, http.StatusUnprocessableEntity, code, "create %s: %s", bad, body)
		require.Contains(t, string(body), "control surface", "create %s: the problem says why", bad)
		code, body = api.call(t, http.MethodPatch, "/webhook-endpoints/"+ok.ID, "Bearer "+adminToken, `{`+bad+`}`)
		require.Equal(t, http.StatusUnprocessableEntity, code, "patch %s: %s", bad, body)
		require.Contains(t, string(body), "control surface", "patch %s: the problem says why", bad)
	}

	// Rows stored before the rule, one per broker: the relay refuses each
	// at delivery, before its transport.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	stored := []string{"nats:" + purge, "kafka:__consumer_offsets", "rabbitmq:amq.rabbitmq.event/x"}
	for _, u := range stored {
		_, err := conn.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types) VALUES ($1, 'whsec_c2VjcmV0', '{order.placed}')`, u)
		require.NoError(t, err)
	}
	env := relayEnv(dbURL)
	env["OUTBOX_NATS_URL"], env["OUTBOX_AMQP_URL"], env["OUTBOX_KAFKA_BROKERS"] = b.natsURL, b.amqpURL, strings.Join(b.kafka, ",")
	startWorker(t, env)
	code, body := api.call(t, http.MethodPost, "/orders", "", `{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)

	refused := func() int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM outbox_messages m JOIN webhook_endpoints e ON e.id = m.destination
			WHERE e.url = ANY ($1) AND m.last_error LIKE '%control surface%'`, stored).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return refused() == len(stored) }, 20*time.Second, 20*time.Millisecond,
		"each stored control-surface destination is refused at delivery, saying why")
	require.Eventually(t, func() bool {
		info, err := b.stream.Info(ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, info.State.Msgs, uint64(3), "the stream is never purged")
		return info.State.Msgs == 4
	}, 10*time.Second, 20*time.Millisecond, "the stream keeps its 3 messages and gets the order's event from the valid endpoint")
	require.NoError(t, nc.Flush())
}
