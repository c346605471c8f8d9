package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// natsRetryDelay is how long a message that could not be applied (a
// database failure, an out-of-order cancel) waits before JetStream
// redelivers it.
const natsRetryDelay = 5 * time.Second

// ConsumeNATS applies the events of a JetStream pull consumer until ctx is
// done: the broker twin of ServeHTTP, with the same inbox and the same
// exactly-once effect. Each message is a CloudEvent in binary mode (ce-id,
// ce-type, ce-time headers; the order as the body), as the relay publishes
// it.
//
// The order of things is what makes it exactly once: the inbox row and the
// effect commit in one transaction, and only then is the message acked
// (DoubleAck: the server confirms it). A crash or a lost ack before that
// means JetStream redelivers, and the inbox turns the redelivery into a
// duplicate; so does a second publish of the event that JetStream's own
// duplicate window did not catch.
//
// Use a durable consumer with explicit acks, so a restarted consumer
// continues where it left off.
func (c *Consumer) ConsumeNATS(ctx context.Context, cons jetstream.Consumer) error {
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("subscribing to the JetStream consumer: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading from the JetStream consumer: %w", err)
		}
		c.handleNATS(ctx, msg)
	}
}

// handleNATS applies one message and settles it with the broker.
func (c *Consumer) handleNATS(ctx context.Context, msg jetstream.Msg) {
	h := msg.Headers()
	env := envelope{ID: h.Get("ce-id"), Type: h.Get("ce-type"), Data: msg.Data()}
	at, err := time.Parse(time.RFC3339Nano, h.Get("ce-time"))
	if env.ID == "" || env.Type == "" || err != nil {
		// Redelivering it cannot help: terminate it, and say so.
		c.counts[BadRequest].Add(1)
		c.logger.WarnContext(ctx, "JetStream message is not a CloudEvent", slog.String("subject", msg.Subject()))
		_ = msg.Term()
		return
	}
	env.CreatedAt = at

	outcome, err := c.apply(ctx, env.ID, env)
	var bad *badEvent
	switch {
	case errors.As(err, &bad):
		outcome = BadRequest
		c.logger.WarnContext(ctx, "JetStream event unreadable", slog.String("event_id", env.ID), slog.String("error", err.Error()))
		_ = msg.Term()
	case errors.Is(err, errOutOfOrder):
		outcome = OutOfOrder
		c.logger.WarnContext(ctx, "JetStream event out of order", slog.String("event_id", env.ID), slog.String("type", env.Type))
		_ = msg.NakWithDelay(natsRetryDelay)
	case err != nil:
		outcome = Error
		c.logger.ErrorContext(ctx, "applying JetStream event", slog.String("event_id", env.ID), slog.String("error", err.Error()))
		_ = msg.NakWithDelay(natsRetryDelay)
	default:
		if err := msg.DoubleAck(ctx); err != nil {
			// Committed but maybe not acked: the redelivery is a duplicate.
			c.logger.WarnContext(ctx, "acking JetStream event", slog.String("event_id", env.ID), slog.String("error", err.Error()))
		}
	}
	c.counts[outcome].Add(1)
	c.logger.DebugContext(ctx, "JetStream event handled", slog.String("event_id", env.ID),
		slog.String("type", env.Type), slog.String("outcome", string(outcome)))
}
