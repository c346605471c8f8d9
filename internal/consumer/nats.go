package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A message that could not be applied (a database failure, an
// out-of-order cancel) waits before JetStream redelivers it: natsRetryDelay
// after its first delivery, doubling with each one up to natsRetryMax.
const (
	natsRetryDelay = 5 * time.Second
	natsRetryMax   = 5 * time.Minute
)

// natsOutOfOrderDeliveries is how often an order.cancelled is refused
// because its order.placed has not been applied (about 20 minutes of
// retries) before it is terminated. The relay sends an order's events in
// order, so a placement that is that late is not coming: the destination
// was added after the order was placed, or the placement was terminated or
// dropped by the stream's limits. Retried for ever, such cancels would
// stay unacknowledged, and once the consumer's MaxAckPending of them
// (1,000 by default) waited, JetStream would deliver nothing else.
// Database failures are retried without a limit: they end.
const natsOutOfOrderDeliveries = 10

// Durable returns the stream's durable pull consumer named durable,
// creating it if it does not exist, for ConsumeNATS.
//
// An existing durable is used as it is: its operator's settings (a
// redelivery limit, a subject filter, the ack wait) survive restarts. It
// must ack explicitly, since the consumer acks each message after its
// transaction commits.
//
// A new one starts with the messages the stream stored at or after start
// (all of them if start is zero). Pass the time the inbox remembers back
// to (now minus its retention): a durable created again, or under a new
// name, on a stream that keeps more than that would otherwise apply again
// events whose ids the inbox has forgotten.
func Durable(ctx context.Context, js jetstream.JetStream, stream, durable string, start time.Time) (jetstream.Consumer, error) {
	cons, err := js.Consumer(ctx, stream, durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cfg := jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy}
		if !start.IsZero() {
			cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
		}
		cons, err = js.CreateConsumer(ctx, stream, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("opening JetStream consumer %q on stream %q: %w", durable, stream, err)
	}
	if p := cons.CachedInfo().Config.AckPolicy; p != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("JetStream consumer %q on stream %q acks %s; the consumer needs explicit acks", durable, stream, p)
	}
	return cons, nil
}

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
	env := envelope{ID: attribute(h, "id"), Type: attribute(h, "type"), Data: msg.Data()}
	// RFC 3339 allows a lowercase t and z; Go's layout does not.
	at, err := time.Parse(time.RFC3339Nano, strings.ToUpper(attribute(h, "time")))
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
		c.outOfOrder.forget(env.ID)
		c.logger.WarnContext(ctx, "JetStream event unreadable", slog.String("event_id", env.ID), slog.String("error", err.Error()))
		_ = msg.Term()
	case errors.Is(err, errTooOld):
		// Redelivering it cannot help: it only gets older.
		outcome = TooOld
		c.outOfOrder.forget(env.ID)
		c.logTooOld(ctx, env.ID, env)
		_ = msg.Term()
	case errors.Is(err, errOutOfOrder):
		outcome = OutOfOrder
		// Counted here, not by JetStream's delivery count, which also
		// counts the deliveries a database outage failed: after a long one
		// a cancel would be terminated the first time it came before its
		// placement.
		n := c.outOfOrder.seen(env.ID)
		if n >= c.natsOutOfOrder {
			c.outOfOrder.forget(env.ID)
			c.logger.ErrorContext(ctx, "JetStream event out of order too long: terminated", slog.String("event_id", env.ID),
				slog.String("type", env.Type), slog.Uint64("times", n))
			// Term without a reason: servers before 2.10 (Debian's) ignore
			// a termination that gives one.
			_ = msg.Term()
			break
		}
		c.logger.WarnContext(ctx, "JetStream event out of order", slog.String("event_id", env.ID), slog.String("type", env.Type),
			slog.Uint64("times", n))
		_ = msg.NakWithDelay(c.natsDelay(n))
	case err != nil:
		outcome = Error
		c.logger.ErrorContext(ctx, "applying JetStream event", slog.String("event_id", env.ID), slog.String("error", err.Error()))
		_ = msg.NakWithDelay(c.natsDelay(deliveries(msg)))
	default:
		c.outOfOrder.forget(env.ID)
		if err := msg.DoubleAck(ctx); err != nil {
			// Committed but maybe not acked: the redelivery is a duplicate.
			c.logger.WarnContext(ctx, "acking JetStream event", slog.String("event_id", env.ID), slog.String("error", err.Error()))
		}
	}
	c.counts[outcome].Add(1)
	c.logger.DebugContext(ctx, "JetStream event handled", slog.String("event_id", env.ID),
		slog.String("type", env.Type), slog.String("outcome", string(outcome)))
}

// deliveries is how often JetStream has delivered msg, this time included.
func deliveries(msg jetstream.Msg) uint64 {
	md, err := msg.Metadata()
	if err != nil || md.NumDelivered == 0 {
		return 1
	}
	return md.NumDelivered
}

// natsDelay is the wait before the redelivery of a message delivered n
// times: the retry delay, doubled with each delivery, at most the maximum.
func (c *Consumer) natsDelay(n uint64) time.Duration {
	d := c.natsRetry
	for range min(n, 32) - 1 {
		if d >= c.natsRetryMax/2 {
			return c.natsRetryMax
		}
		d *= 2
	}
	return min(d, c.natsRetryMax)
}

// outOfOrderCounts counts, per event id, the times a JetStream message was
// refused as out of order, until it is applied or terminated. In memory: a
// restart starts the counts again, which only makes the retries last
// longer.
type outOfOrderCounts struct {
	mu sync.Mutex
	n  map[string]uint64
}

// seen counts one more refusal of id and returns the count.
func (o *outOfOrderCounts) seen(id string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]uint64{}
	}
	o.n[id]++
	return o.n[id]
}

// forget drops id's count: it was applied or terminated.
func (o *outOfOrderCounts) forget(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.n, id)
}

// attribute reads a CloudEvents attribute from its ce- header, decoding
// the percent-encoding the binding puts on values (any %XX, as a producer
// may encode more than it must); "" when absent or not decodable, which
// refuses the message.
func attribute(h nats.Header, name string) string {
	v, err := url.PathUnescape(header(h, "ce-"+name))
	if err != nil {
		return ""
	}
	return v
}

// header reads a header whatever the case of its name, as the CloudEvents
// NATS binding reads names (another producer, or a bridge, may send Ce-Id);
// NATS headers are case-sensitive, and Get is an exact lookup.
func header(h nats.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
