// Package brokertest gives tests the message brokers the project's machines
// run, as dbtest gives them PostgreSQL: NATS with JetStream and RabbitMQ, on
// 127.0.0.1 (.ci/ensure-brokers starts them), or wherever TEST_NATS_URL and
// TEST_AMQP_URL say. A test whose broker does not answer is skipped, saying
// why, so a laptop without them still runs everything else. Each test gets
// a stream or a queue of its own, deleted when it ends, so tests run in
// parallel and leave nothing behind. There is no Kafka server here: Kafka
// tests use franz-go's in-process kfake cluster instead.
package brokertest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// NATSURL is the NATS server tests use.
func NATSURL() string { return envOr("TEST_NATS_URL", "nats://127.0.0.1:4222") }

// AMQPURL is the RabbitMQ server tests use.
func AMQPURL() string { return envOr("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// QueueExpiry is the arguments of a test's queue: RabbitMQ deletes it a
// minute after it was last used. Auto-delete alone never fires for the
// tests' queues, read with basic.get by no subscribed consumer, and they
// piled up run after run.
var QueueExpiry = amqp.Table{"x-expires": int32(60_000)}

// missing skips a test whose broker is not there, on a developer's machine;
// under CI (CI set, as .ci/run sets it) it fails it: a broker that could
// not be reached must not turn the broker tests into a green run.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// JetStream connects to the NATS server, or skips the test when none
// answers; the connection closes when the test ends.
func JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(NATSURL())
	if err != nil {
		missing(t, "no NATS server at %s (TEST_NATS_URL; .ci/ensure-brokers starts one): %v", NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("opening JetStream: %v", err)
	}
	return nc, js
}

// Stream makes a file-backed JetStream stream of the test's own, named
// prefix_<random>, on one subject no other test uses (returned), with
// JetStream's duplicate window set to dedup (0: the server's default). It
// is deleted when the test ends.
func Stream(t testing.TB, js jetstream.JetStream, prefix string, dedup time.Duration) (jetstream.Stream, string) {
	t.Helper()
	id := strings.ReplaceAll(uuid.NewString(), "-", "")
	name := strings.ToUpper(prefix) + "_" + id
	subject := strings.ToLower(prefix) + "." + id + ".events"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Duplicates: dedup})
	if err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return s, subject
}

// CreateStream creates a stream as js.CreateStream does, trying again
// while the server fails to create its store. The NATS server removes an
// account's store directory with its last stream (seen with nats-server
// 2.9), so a stream created while a test in another process deletes the
// only other one can find its parent directory gone: "error creating
// store for stream" (10049). The next try makes the directory anew.
func CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for {
		s, err := js.CreateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != streamStoreFailed {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// streamStoreFailed is JetStream's error code for a stream whose store
// could not be created (JSStreamStoreFailedErr).
const streamStoreFailed jetstream.ErrorCode = 10049

// RabbitMQ connects to the RabbitMQ server, or skips the test when none
// answers; the connection closes when the test ends.
func RabbitMQ(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		missing(t, "no RabbitMQ at %s (TEST_AMQP_URL; .ci/ensure-brokers starts one): %v", AMQPURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
