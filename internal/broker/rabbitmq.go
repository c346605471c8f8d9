package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitMQ publishes to RabbitMQ exchanges with publisher confirms,
// persistent delivery and the mandatory flag: a message is delivered once
// the broker confirms it, and one no queue is bound to receive is returned
// and counted as a failed attempt instead of silently dropped. message-id is
// the event id; RabbitMQ itself does not deduplicate on it, the consumer's
// inbox does.
//
// Each destination (exchange and routing key) has a connection of its own
// (destinations): RabbitMQ's flow control and alarms block whole
// connections, and a connection whose confirms stop coming is dropped with
// every publish in flight on it, so on a shared one a destination that the
// broker throttles, or whose queue holds its confirms, failed its
// neighbours' publishes too.
type RabbitMQ struct {
	source string
	// schemas are the dataschema of each event type (Config.DataSchemas).
	schemas map[string]string
	conns   *destinations[*rabbitConn]
}

// rabbitConn is one destination's connection, and its channels.
type rabbitConn struct {
	// name is the connection's name on the broker (rabbitmqctl
	// list_connections client_properties): the relay's and the
	// destination's.
	url, name string

	mu   sync.Mutex
	conn *amqp.Connection
	// idle holds channels in confirm mode between publishes. A channel
	// publishes one message at a time, so a return (unroutable) is known to
	// belong to the publish whose confirm follows it.
	idle   []*confirmChannel
	closed bool
	failed failedDial
	// dialing is closed when the dial in progress ends; nil when none is.
	dialing chan struct{}
	// confirmedAt is when a publish was last confirmed (Unix nanoseconds):
	// a confirm that does not come in time says the connection is not
	// answering only if no other publish was confirmed meanwhile.
	confirmedAt atomic.Int64
}

type confirmChannel struct {
	conn    *amqp.Connection // the connection it is on
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// NewRabbitMQ returns a transport to the RabbitMQ server at url. A
// destination's connection is made at its first publish.
func NewRabbitMQ(url, source string) *RabbitMQ {
	open := func(key string) *rabbitConn {
		name := "outbox-relay " + key
		if key == sharedKey {
			name = "outbox-relay (shared by the destinations beyond the bound)"
		}
		return &rabbitConn{url: url, name: name}
	}
	return &RabbitMQ{source: source, conns: newDestinations(open, (*rabbitConn).close)}
}

const (
	// maxIdleChannels bounds the channels kept open between publishes.
	maxIdleChannels = 64
	// dialTimeout bounds a dial and its AMQP handshake.
	dialTimeout = 5 * time.Second
	// closeTimeout is how long Close waits for the broker's goodbye.
	closeTimeout = 2 * time.Second
)

// channel returns an idle channel or opens one, dialing if the connection
// is gone. Opening a channel is a round trip that a broker may never
// answer (one under a memory or disk alarm stops reading a publishing
// connection, and keeps sending heartbeats): it is waited for no longer
// than ctx, and then the connection is dropped (abandon).
func (t *rabbitConn) channel(ctx context.Context) (*confirmChannel, error) {
	c, conn, err := t.idleOrConn(ctx)
	if c != nil || err != nil {
		return c, err
	}
	type result struct {
		c   *confirmChannel
		err error
	}
	opened := make(chan result, 1)
	go func() {
		c, err := openChannel(conn)
		opened <- result{c, err}
	}()
	select {
	case r := <-opened:
		return r.c, r.err
	case <-ctx.Done():
		// Closing the connection ends the open (opened has room for its
		// result), and any channel it made.
		t.abandon(conn)
		return nil, fmt.Errorf("opening a RabbitMQ channel: %w", ctx.Err())
	}
}

// abandon drops a connection the broker stopped answering on (a channel
// that would not open, a confirm that did not come in time) and closes it
// at once: the next publish dials anew, and every call still waiting on it
// (an open, a close) ends now rather than when the broker's heartbeats give
// up, which under a memory alarm they never do.
func (t *rabbitConn) abandon(conn *amqp.Connection) {
	t.mu.Lock()
	if t.conn == conn {
		t.conn = nil
		idle := t.idle[:0]
		for _, c := range t.idle {
			if c.conn != conn {
				idle = append(idle, c)
			}
		}
		t.idle = idle
	}
	t.mu.Unlock()
	go conn.CloseDeadline(time.Now()) //nolint:errcheck
}

// idleOrConn returns an idle channel, or else the connection to open one
// on, dialing if there is none. The dial runs in the background and the
// publishes that need it share it, each waiting no longer than its own
// deadline; the dial itself is bounded by dialTimeout.
func (t *rabbitConn) idleOrConn(ctx context.Context) (*confirmChannel, *amqp.Connection, error) {
	for {
		t.mu.Lock()
		c, conn, dialing, err := t.idleOrConnLocked()
		t.mu.Unlock()
		if dialing == nil {
			return c, conn, err
		}
		if err := awaitDial(ctx, dialing, "RabbitMQ"); err != nil {
			return nil, nil, err
		}
	}
}

// idleOrConnLocked is idleOrConn under the lock: an idle channel, the
// connection, an error, or the dial to wait for.
func (t *rabbitConn) idleOrConnLocked() (*confirmChannel, *amqp.Connection, <-chan struct{}, error) {
	if t.closed {
		return nil, nil, nil, errClosed
	}
	for len(t.idle) > 0 {
		c := t.idle[len(t.idle)-1]
		t.idle = t.idle[:len(t.idle)-1]
		if !c.ch.IsClosed() {
			return c, nil, nil, nil
		}
	}
	if t.conn != nil && !t.conn.IsClosed() {
		return nil, t.conn, nil, nil
	}
	if err := t.failed.recent(); err != nil {
		return nil, nil, nil, err
	}
	if t.dialing == nil {
		t.dialing = make(chan struct{})
		go t.dial(t.dialing)
	}
	return nil, nil, t.dialing, nil
}

// dial connects and keeps the connection, or the failure, then closes
// done.
func (t *rabbitConn) dial(done chan struct{}) {
	conn, err := amqp.DialConfig(t.url, amqp.Config{Dial: amqp.DefaultDial(dialTimeout),
		Properties: amqp.Table{"connection_name": t.name}})
	t.mu.Lock()
	defer t.mu.Unlock()
	defer close(done)
	t.dialing = nil
	switch {
	case err != nil:
		t.failed.set(fmt.Errorf("connecting to RabbitMQ: %w", hideURL(err)))
	case t.closed:
		go conn.CloseDeadline(time.Now().Add(closeTimeout)) //nolint:errcheck
	default:
		t.conn = conn
	}
}

// openChannel opens a channel in confirm mode on conn.
func openChannel(conn *amqp.Connection) (*confirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a RabbitMQ channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		discard(ch)
		return nil, fmt.Errorf("putting the RabbitMQ channel in confirm mode: %w", err)
	}
	return &confirmChannel{conn: conn, ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
		closed: ch.NotifyClose(make(chan *amqp.Error, 1))}, nil
}

// release keeps a healthy channel for the next publish.
func (t *rabbitConn) release(c *confirmChannel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || c.ch.IsClosed() || len(t.idle) >= maxIdleChannels {
		discard(c.ch)
		return
	}
	t.idle = append(t.idle, c)
}

// discard closes a channel without waiting: closing is a round trip too,
// which a broker that stopped answering leaves waiting until its connection
// closes, and no publish, nor the lock, may wait for that.
func discard(ch *amqp.Channel) { go ch.Close() } //nolint:errcheck

// Deliver implements relay.Transport.
func (t *RabbitMQ) Deliver(ctx context.Context, d relay.Delivery) relay.Result {
	dest := d.Target()
	rc, release, err := t.conns.acquire(dest.Exchange + "/" + dest.RoutingKey)
	if err != nil {
		return relay.Result{Err: fmt.Errorf("publishing to RabbitMQ: %w", err)}
	}
	defer release()
	return rc.publish(ctx, dest, t.source, t.schemas, d)
}

// publish sends d on one of the connection's channels and waits for its
// confirm.
func (t *rabbitConn) publish(ctx context.Context, dest destination.Destination, source string, schemas map[string]string, d relay.Delivery) relay.Result {
	c, err := t.channel(ctx)
	if err != nil {
		return relay.Result{Err: err}
	}
	ce, trace := attributes(d, source, schemas)
	headers := amqp.Table{}
	// The AMQP binding's binary mode: attributes as cloudEvents:
	// application properties.
	for _, a := range ce {
		headers["cloudEvents:"+a.name] = a.value
	}
	for _, a := range trace {
		headers[a.name] = a.value
	}
	pub := amqp.Publishing{
		MessageId: d.EventID.String(), Type: d.Type, Timestamp: d.CreatedAt, AppId: source,
		ContentType: contentType, DeliveryMode: amqp.Persistent, Headers: headers, Body: d.Data,
	}
	// amqp091-go heeds ctx only before it writes, and its writes have no
	// deadline: a broker that stops reading (a memory or disk alarm
	// blocks a publishing connection) holds a message larger than the
	// socket buffers in the write itself. At the deadline the connection
	// is dropped, which ends the write; it would carry nothing more
	// anyway until the broker reads again.
	stop := context.AfterFunc(ctx, func() { t.abandon(c.conn) })
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, dest.Exchange, dest.RoutingKey, true, false, pub)
	if !stop() {
		// The deadline came first: whatever the write did, the
		// connection is being dropped, and the confirm will not come.
		discard(c.ch)
		return relay.Result{Err: fmt.Errorf("publishing to RabbitMQ: the broker did not take the message in time: %w", ctx.Err())}
	}
	if err != nil {
		discard(c.ch)
		return relay.Result{Err: fmt.Errorf("publishing to RabbitMQ: %w", err)}
	}
	published := time.Now().UnixNano()
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		// No confirm within the delivery's time. This channel's next
		// confirm would be this message's: it is not used again. The
		// connection is dropped only if nothing else was confirmed on it
		// meanwhile (the broker stopped answering, as under a memory
		// alarm); otherwise only this destination's queue holds its
		// confirms (a quorum queue without a quorum), and closing the
		// connection would fail every other destination's publishes in
		// flight on it.
		if t.confirmedAt.Load() > published {
			discard(c.ch)
		} else {
			t.abandon(c.conn)
		}
		return relay.Result{Err: fmt.Errorf("waiting for RabbitMQ's confirm: %w", err)}
	}
	if acked {
		t.confirmedAt.Store(time.Now().UnixNano())
	}
	select {
	case ret, ok := <-c.returns:
		if !ok {
			// Closed with the channel: the reason is below.
			break
		}
		// A return precedes its confirm: no queue took the message.
		t.release(c)
		return relay.Result{Err: fmt.Errorf("RabbitMQ returned the message as unroutable: %d %s (exchange %q, routing key %q)",
			ret.ReplyCode, ret.ReplyText, dest.Exchange, dest.RoutingKey)}
	default:
	}
	if !acked {
		var reason error = errNack
		select {
		case e := <-c.closed:
			if e != nil {
				reason = e
			}
		default:
		}
		if c.conn.IsClosed() && errors.Is(reason, errNack) {
			// Closed by this transport (abandon), not refused.
			reason = errors.New("the connection was dropped before the broker confirmed it")
		}
		discard(c.ch)
		// 406 PRECONDITION_FAILED closes the channel for something about
		// this message alone: over the broker's max_message_size (the
		// only one a publish of the relay's properties can meet). It is
		// this message's fault, as NATS's and Kafka's too-large answers.
		var amqpErr *amqp.Error
		tooLarge := errors.As(reason, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed
		return relay.Result{Err: fmt.Errorf("publishing to RabbitMQ exchange %q: %w", dest.Exchange, reason), MessageFault: tooLarge}
	}
	t.release(c)
	return relay.Result{Acked: true}
}

// errNack is a confirm that says the broker did not take the message.
var errNack = errors.New("the broker refused it (nack)")

// Close closes every destination's connection, giving the broker
// closeTimeout to answer, and makes every later publish fail.
func (t *RabbitMQ) Close() { t.conns.closeAll() }

// close closes the connection and its channels, giving the broker
// closeTimeout to answer, and makes every later publish on it fail.
func (t *rabbitConn) close() {
	t.mu.Lock()
	conn := t.conn
	t.conn, t.idle, t.closed = nil, nil, true
	t.mu.Unlock()
	if conn != nil {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
	}
}
