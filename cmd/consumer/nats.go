// With broker destinations the consumer also applies the events of a
// JetStream stream, as it applies webhooks (an event older than
// CONSUMER_INBOX_RETENTION is terminated):
//
//	NATS_URL          optional: the NATS servers of the stream
//	NATS_STREAM       the stream (required with NATS_URL)
//	NATS_DURABLE      the durable pull consumer to create or resume (default
//	                  ledger)
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/orders/internal/consumer"
)

// A service made without broker destinations (./task new:service -without
// brokers) has no such file, nor the lines marked "brokers" elsewhere.

// natsConsumer resumes the durable pull consumer, or creates it starting
// where the inbox's memory starts (consumer.Durable), and returns what
// applies its messages with c until its context ends, and what closes the
// connection.
func natsConsumer(ctx context.Context, cfg config, c *consumer.Consumer) (consume func(context.Context) error, closeNATS func(), err error) {
	nc, err := nats.Connect(cfg.natsURL, nats.Name("consumer"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("opening JetStream: %w", err)
	}
	var start time.Time
	if cfg.retention > 0 {
		start = time.Now().Add(-cfg.retention)
	}
	cons, err := consumer.Durable(ctx, js, cfg.natsStream, cfg.natsDurable, start)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return func(ctx context.Context) error { return c.ConsumeNATS(ctx, cons) }, nc.Close, nil
}
