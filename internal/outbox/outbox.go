// Package outbox is the transactional outbox as the modules that use it see
// it: Enqueue writes an event in the caller's transaction, so it commits or
// rolls back with the business rows, and the relay (package relay, River
// jobs run by cmd/worker) delivers what was committed as signed webhooks or
// broker messages, retrying with backoff up to a cap. Package admin is the
// endpoints and the read models behind the admin API and the ops page;
// package destination reads where an endpoint's messages go.
//
// Every Enqueue records one event (kept for the retention, subscribed or
// not, so it can be replayed) and one delivery (a message) per subscribed
// endpoint. Delivery is at-least-once. A relay killed between sending a
// webhook and recording the outcome sends it again later; receivers must
// deduplicate on the webhook-id header, which is the event id: the same on
// every retry, every replay and for every endpoint the event goes to.
//
// Events that share an ordering key are delivered to each endpoint in the
// order they committed: one is not sent until the one before it was
// delivered (or skipped by a person).
//
// This package never imports the modules that use it (orders and others):
// they depend on it, not the other way round.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Message statuses. They are strings in the table, so a person reading it
// sees what happened without a lookup.
const (
	StatusPending   = "pending"
	StatusClaimed   = "claimed"
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
	// StatusDiscarded settles the messages of a deleted endpoint: never
	// sent, never retried, and unlike failed ones waiting for nobody.
	StatusDiscarded = "discarded"
)

// Endpoint states, as the API, the ops page and the metrics name them.
const (
	// HealthHealthy: enabled and delivering; single messages may be
	// retrying on their own schedules.
	HealthHealthy = "healthy"
	// HealthBackingOff: enabled, but failing as a whole (refused, timed out,
	// 5xx, 429 several times in a row): nothing is sent to it until its next
	// probe, when one message tries it. Waiting costs no message an attempt.
	HealthBackingOff = "backing_off"
	// HealthPaused: disabled by a person or by a 410 Gone. Its messages are
	// still written, and wait to be delivered when it is enabled again.
	HealthPaused = "paused"
)

// Statuses are the message statuses, in the order a message goes through
// them.
var Statuses = []string{StatusPending, StatusClaimed, StatusDelivered, StatusFailed, StatusDiscarded}

var (
	// ErrNotInTx is returned by Enqueue when it is not given a live
	// transaction: nil, already committed or rolled back. Writing the message
	// outside the business transaction is the dual-write bug itself, so
	// Enqueue refuses rather than degrading.
	ErrNotInTx = errors.New("outbox: enqueue needs the caller's open transaction")

	// ErrInvalidEvent is returned for an event that cannot be stored: no
	// type, or data that does not encode as JSON.
	ErrInvalidEvent = errors.New("outbox: invalid event")

	// ErrNoPartition is returned when the event's time has no partition
	// of the outbox tables to go in: the worker's prune job makes them
	// OUTBOX_PARTITIONS_AHEAD ahead, so no worker has run it for that long
	// (the outbox_partitions_ahead_seconds alert says so days before).
	ErrNoPartition = errors.New("outbox: no partition of the outbox tables holds the event's time; " +
		"partitions are made ahead by the worker's prune job: is a worker running?")
)

// Classify returns err, wrapped with ErrNoPartition when it is
// PostgreSQL's refusal of an outbox row that no partition holds: for a
// caller that sends Queue's statements itself and gets the error from its
// batch.
func Classify(err error) error {
	var pgErr *pgconn.PgError // check_violation, with PostgreSQL's message
	if errors.As(err, &pgErr) && pgErr.Code == "23514" &&
		strings.HasPrefix(pgErr.Message, "no partition of relation \"outbox_") {
		return fmt.Errorf("%w: %w", ErrNoPartition, err)
	}
	return err
}

// Event is something that happened, to be announced to every endpoint
// subscribed to its type.
type Event struct {
	// Type names the event, such as "order.placed".
	Type string
	// Data is the event's body, encoded to JSON now: the payload is a
	// snapshot of what was true in this transaction, and delivery never
	// re-reads the business rows.
	Data any
	// OrderingKey, when set, orders the event after every earlier event of
	// the same key, for each endpoint: the orders module keys its events by
	// order id, so no order.cancelled overtakes its order.placed. Events
	// without a key are delivered in parallel. A key is a sequence: while
	// one of its events cannot be delivered, the later ones wait.
	OrderingKey string
}

// maxOrderingKey bounds a key's length: it is compared and indexed, and a
// key is an identifier, not data.
const maxOrderingKey = 200

// Enqueue writes the event in tx and returns its id, the webhook-id every
// delivery of it carries. In the same statement it writes one pending
// delivery per endpoint subscribed to ev.Type (none when nobody subscribes;
// the event is recorded all the same). A paused (disabled) endpoint gets its
// delivery too, sent when it is enabled again. Enqueue never opens a
// transaction of its own: the rows commit or roll back with the caller's.
//
// With an ordering key, Enqueue holds a lock on the key until tx ends, so
// transactions writing events of one key commit one after the other, in
// the order of their event ids.
//
// When ctx holds a valid OpenTelemetry span, its trace context (from the
// process's propagator) is stored with the event, and its deliveries
// continue that trace and send traceparent to the receiver.
func Enqueue(ctx context.Context, tx pgx.Tx, ev Event) (uuid.UUID, error) {
	var b pgx.Batch
	q, err := Queue(ctx, tx, &b, ev)
	if err != nil {
		return uuid.Nil, err
	}
	err = tx.SendBatch(ctx, &b).Close()
	if errors.Is(err, pgx.ErrTxClosed) {
		return uuid.Nil, fmt.Errorf("enqueuing %q: %w: %w", ev.Type, ErrNotInTx, err)
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("enqueuing %q: %w", ev.Type, Classify(err))
	}
	return q.ID(), nil
}

// Queue is Enqueue for a caller that has statements of its own to send:
// it adds the event's statement to b, and the caller sends b in tx
// (tx.SendBatch, then Close) with its own statements, in one round trip.
// The outbox then adds no round trip to the transaction; orders.Service.Place
// sends an order's lines and its event this way. Everything else is as
// Enqueue: the event is validated here, the rows are written when b is
// sent, and they commit or roll back with tx. If b is sent anywhere but in
// tx, the event is not part of the caller's transaction: that is the
// dual-write bug Enqueue exists to prevent.
func Queue(ctx context.Context, tx pgx.Tx, b *pgx.Batch, ev Event) (*Queued, error) {
	if isNil(tx) {
		return nil, fmt.Errorf("enqueuing %q: %w", ev.Type, ErrNotInTx)
	}
	if ev.Type == "" {
		return nil, fmt.Errorf("enqueuing: %w: empty type", ErrInvalidEvent)
	}
	if len(ev.OrderingKey) > maxOrderingKey {
		return nil, fmt.Errorf("enqueuing %q: %w: ordering key longer than %d bytes", ev.Type, ErrInvalidEvent, maxOrderingKey)
	}
	payload, err := json.Marshal(ev.Data)
	if err != nil {
		return nil, fmt.Errorf("enqueuing %q: %w: %w", ev.Type, ErrInvalidEvent, err)
	}
	var key *string
	if ev.OrderingKey != "" {
		key = &ev.OrderingKey
	}
	// The trace context of the caller's span, if any, travels with the
	// event so its deliveries continue the same trace (see trace.go).
	q := &Queued{}
	outboxdb.QueueEventEnqueue(b, outboxdb.EventEnqueueParams{
		Type: ev.Type, Payload: payload, TraceContext: traceContext(ctx), OrderingKey: key,
	}, &q.id)
	// A second statement, only when asked for: the NOTIFY is what costs,
	// and the default path does not carry even its check.
	if tx.Conn().Config().RuntimeParams[notifySetting] == "on" {
		outboxdb.QueueEventNotify(b, ev.Type)
	}
	return q, nil
}

// Queued is an event added to a batch by Queue.
type Queued struct {
	id uuid.UUID
}

// ID is the event's id, the webhook-id every delivery of it carries: set
// when the batch's results are read, uuid.Nil if its statement did not run.
// Like every row written in the transaction, the event exists only if the
// transaction commits.
func (q *Queued) ID() uuid.UUID { return q.id }

// notifySetting marks the connections made with NotifyRelays (and shows on
// the server as the session setting outbox.notify).
const notifySetting = "outbox.notify"

// NotifyRelays makes every Enqueue on connections made with cfg send a
// NOTIFY naming the event's destinations (when it has any), delivered at
// commit, so relays started with RelayConfig.Listen claim it at once
// instead of at their next poll. It costs the write path a second statement
// and, at commit, a database-wide lock to queue the notification (a write
// throughput the lab's bench measures). The poll stays the mechanism that makes delivery
// correct; the NOTIFY only makes it sooner.
func NotifyRelays(cfg *pgx.ConnConfig) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams[notifySetting] = "on"
}

// isNil catches a nil interface and a typed nil pointer inside one, which
// would otherwise panic deep in pgx instead of naming the mistake.
func isNil(tx pgx.Tx) bool {
	if tx == nil {
		return true
	}
	v := reflect.ValueOf(tx)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
