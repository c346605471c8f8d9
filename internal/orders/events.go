package orders

// The events this module emits, as endpoints subscribe to them. Each is
// enqueued with outbox.Enqueue in the transaction that makes it true, with
// a snapshot of what was true there as its payload; receivers deduplicate
// on the webhook-id. A payload is a contract: add fields, never change or
// remove them. Each carries its order's id as ordering key, so a receiver
// gets an order's events in the order they happened.
const (
	// EventPlaced: an order was placed. Payload: the Order.
	EventPlaced = "order.placed"
	// EventCancelled: an order was cancelled. Payload: the Order.
	EventCancelled = "order.cancelled"
)

// Events lists every event type the module emits: cmd/dev subscribes its
// demo receiver to all of them.
var Events = []string{EventPlaced, EventCancelled}
