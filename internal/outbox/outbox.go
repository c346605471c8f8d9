// Package outbox is the transactional outbox: Enqueue writes an event in the
// caller's transaction, so it commits or rolls back with the business rows,
// and the relay (River jobs run by cmd/worker) delivers what was committed as
// signed webhooks, retrying with backoff up to a cap.
//
// Delivery is at-least-once. A relay killed between sending a webhook and
// recording the outcome sends it again later; receivers must deduplicate on
// the webhook-id header, which is the message id and never changes across
// retries.
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

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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

var (
	// ErrNotInTx is returned by Enqueue when it is not given a live
	// transaction: nil, already committed or rolled back. Writing the message
	// outside the business transaction is the dual-write bug itself, so
	// Enqueue refuses rather than degrading.
	ErrNotInTx = errors.New("outbox: enqueue needs the caller's open transaction")

	// ErrInvalidEvent is returned for an event that cannot be stored: no
	// type, or data that does not encode as JSON.
	ErrInvalidEvent = errors.New("outbox: invalid event")

	// ErrNotFound is returned when an endpoint or message does not exist.
	ErrNotFound = errors.New("outbox: not found")

	// ErrConflict is returned when a transition does not apply to a row's
	// current status, such as retrying a message that has not failed.
	ErrConflict = errors.New("outbox: conflicting state")
)

// Event is something that happened, to be announced to every endpoint
// subscribed to its type.
type Event struct {
	// Type names the event, such as "order.placed".
	Type string
	// Data is the event's body, encoded to JSON now: the payload is a
	// snapshot of what was true in this transaction, and delivery never
	// re-reads the business rows.
	Data any
}

// Enqueue writes the event in tx, as one pending row per endpoint subscribed
// to ev.Type, and returns the new messages' ids (none when nobody
// subscribes). A paused (disabled) endpoint gets its row too, delivered when
// it is enabled again. Enqueue never opens a transaction of its own: the
// rows commit or roll back with the caller's.
//
// When ctx holds a valid OpenTelemetry span, its trace context (from the
// process's propagator) is stored with the messages, and their deliveries
// continue that trace and send traceparent to the receiver.
func Enqueue(ctx context.Context, tx pgx.Tx, ev Event) ([]uuid.UUID, error) {
	if isNil(tx) {
		return nil, fmt.Errorf("enqueuing %q: %w", ev.Type, ErrNotInTx)
	}
	if ev.Type == "" {
		return nil, fmt.Errorf("enqueuing: %w: empty type", ErrInvalidEvent)
	}
	payload, err := json.Marshal(ev.Data)
	if err != nil {
		return nil, fmt.Errorf("enqueuing %q: %w: %w", ev.Type, ErrInvalidEvent, err)
	}
	// The trace context of the caller's span, if any, travels with the
	// message so its delivery continues the same trace (see trace.go).
	ids, err := outboxdb.New(tx).MessageEnqueue(ctx, ev.Type, payload, traceContext(ctx))
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil, fmt.Errorf("enqueuing %q: %w: %w", ev.Type, ErrNotInTx, err)
	}
	if err != nil {
		return nil, fmt.Errorf("enqueuing %q: %w", ev.Type, err)
	}
	return ids, nil
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
