package orders

import (
	"embed"
	"encoding/json"

	"github.com/outboxkit/orders/internal/outbox"
)

// eventFiles holds each event type's JSON Schema and example, as
// events/TYPE.schema.json and events/TYPE.example.json.
//
//go:embed events
var eventFiles embed.FS

// eventFile reads one of eventFiles; a missing one is a build defect,
// which the catalog's tests catch.
func eventFile(name string) json.RawMessage {
	b, _ := eventFiles.ReadFile("events/" + name)
	return b
}

// EventTypes are the module's entries in the event catalog (outbox.Catalog):
// for each type it emits, what its data holds. Change a schema only by
// adding to it, or raise the type's version (docs/reference.md says which
// changes break receivers).
var EventTypes = []outbox.EventType{
	{
		Name: EventPlaced, Version: 1,
		Description: "An order was placed: its data is the order, with its lines and total.",
		Schema:      eventFile("order.placed.schema.json"), Example: eventFile("order.placed.example.json"),
	},
	{
		Name: EventCancelled, Version: 1,
		Description: "An order was cancelled: its data is the order, with when it was cancelled.",
		Schema:      eventFile("order.cancelled.schema.json"), Example: eventFile("order.cancelled.example.json"),
	},
}
