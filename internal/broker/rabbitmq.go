package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/orders/internal/outbox"
)

// RabbitMQ publishes to RabbitMQ exchanges with publisher confirms,
// persistent delivery and the mandatory flag: a message is delivered once
// the broker confirms it, and one no queue is bound to receive is returned
// and counted as a failed attempt instead of silently dropped. message-id is
// the event id; RabbitMQ itself does not deduplicate on it, the consumer's
// inbox does.
type RabbitMQ struct {
	url, source string

	mu   sync.Mutex
	conn *amqp.Connection
	// idle holds channels in confirm mode between publishes. A channel
	// publishes one message at a time, so a return (unroutable) is known to
	// belong to the publish whose confirm follows it.
	idle []*confirmChannel
}

type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// NewRabbitMQ returns a transport to the RabbitMQ server at url. It
// connects at the first publish.
func NewRabbitMQ(url, source string) *RabbitMQ { return &RabbitMQ{url: url, source: source} }

// maxIdleChannels bounds the channels kept open between publishes.
const maxIdleChannels = 64

// channel returns an idle channel or opens one, dialing if the connection
// is gone.
func (t *RabbitMQ) channel() (*confirmChannel, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.idle) > 0 {
		c := t.idle[len(t.idle)-1]
		t.idle = t.idle[:len(t.idle)-1]
		if !c.ch.IsClosed() {
			return c, nil
		}
	}
	if t.conn == nil || t.conn.IsClosed() {
		conn, err := amqp.DialConfig(t.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second),
			Properties: amqp.Table{"connection_name": "outbox-relay"}})
		if err != nil {
			return nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
		}
		t.conn = conn
	}
	ch, err := t.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a RabbitMQ channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("putting the RabbitMQ channel in confirm mode: %w", err)
	}
	c := &confirmChannel{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
		closed: ch.NotifyClose(make(chan *amqp.Error, 1))}
	return c, nil
}

// release keeps a healthy channel for the next publish.
func (t *RabbitMQ) release(c *confirmChannel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.ch.IsClosed() || len(t.idle) >= maxIdleChannels {
		_ = c.ch.Close()
		return
	}
	t.idle = append(t.idle, c)
}

// Deliver implements outbox.Transport.
func (t *RabbitMQ) Deliver(ctx context.Context, d outbox.Delivery) outbox.Result {
	dest := d.Target()
	c, err := t.channel()
	if err != nil {
		return outbox.Result{Err: err}
	}
	ce, trace := attributes(d, t.source)
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
		MessageId: d.EventID.String(), Type: d.Type, Timestamp: d.CreatedAt, AppId: t.source,
		ContentType: contentType, DeliveryMode: amqp.Persistent, Headers: headers, Body: d.Data,
	}
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, dest.Exchange, dest.RoutingKey, true, false, pub)
	if err != nil {
		_ = c.ch.Close()
		return outbox.Result{Err: fmt.Errorf("publishing to RabbitMQ: %w", err)}
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		// The confirm may still come: this channel's next confirm would be
		// this message's, so it is not reused.
		_ = c.ch.Close()
		return outbox.Result{Err: fmt.Errorf("waiting for RabbitMQ's confirm: %w", err)}
	}
	select {
	case ret, ok := <-c.returns:
		if !ok {
			// Closed with the channel: the reason is below.
			break
		}
		// A return precedes its confirm: no queue took the message.
		t.release(c)
		return outbox.Result{Err: fmt.Errorf("RabbitMQ returned the message as unroutable: %d %s (exchange %q, routing key %q)",
			ret.ReplyCode, ret.ReplyText, dest.Exchange, dest.RoutingKey)}
	default:
	}
	if !acked {
		var reason error = errors.New("the broker refused it (nack)")
		select {
		case e := <-c.closed:
			if e != nil {
				reason = e
			}
		default:
		}
		_ = c.ch.Close()
		return outbox.Result{Err: fmt.Errorf("publishing to RabbitMQ exchange %q: %w", dest.Exchange, reason)}
	}
	t.release(c)
	return outbox.Result{Acked: true}
}

// Close closes the connection and its channels.
func (t *RabbitMQ) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.idle = nil
	if t.conn != nil {
		_ = t.conn.Close()
	}
}
