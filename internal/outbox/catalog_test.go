package outbox_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

// shipped is a valid entry the tests spoil one field at a time.
func shipped() outbox.EventType {
	return outbox.EventType{
		Name: "order.shipped", Version: 2, Description: "An order left the warehouse.",
		Schema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema",` +
			`"$id":"urn:example:events:order.shipped:v2","type":"object"}`),
		Example: json.RawMessage(`{}`),
	}
}

// A catalog refuses an entry a receiver could not use, and a type
// declared twice: the api would answer for it with one of them at random.
func TestACatalogRefusesEntriesReceiversCannotUse(t *testing.T) {
	t.Parallel()
	tests := map[string]func(*outbox.EventType){
		"no name":               func(e *outbox.EventType) { e.Name = "" },
		"version 0":             func(e *outbox.EventType) { e.Version = 0 },
		"no description":        func(e *outbox.EventType) { e.Description = " " },
		"two lines":             func(e *outbox.EventType) { e.Description = "Shipped.\nBy truck." },
		"no example":            func(e *outbox.EventType) { e.Example = nil },
		"a schema of no object": func(e *outbox.EventType) { e.Schema = json.RawMessage(`[]`) },
		"another draft": func(e *outbox.EventType) {
			e.Schema = json.RawMessage(`{"$schema":"http://json-schema.org/draft-07/schema#","$id":"urn:x:order.shipped:v2"}`)
		},
		"an $id of another version": func(e *outbox.EventType) { e.Version = 3 },
	}
	for name, spoil := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := shipped()
			spoil(&e)
			_, err := outbox.NewCatalog(e)
			require.ErrorIs(t, err, outbox.ErrInvalidCatalog)
		})
	}
	_, err := outbox.NewCatalog(shipped(), shipped())
	require.ErrorIs(t, err, outbox.ErrInvalidCatalog, "a type declared twice")
	c, err := outbox.NewCatalog(shipped())
	require.NoError(t, err, "the entry as made is valid")
	require.Equal(t, "urn:example:events:order.shipped:v2", c.Types()[0].SchemaID())
}

func ExampleNewCatalog() {
	catalog, err := outbox.NewCatalog(outbox.EventType{
		Name: "order.shipped", Version: 1,
		Description: "An order left the warehouse: its data is the shipment.",
		Schema: json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema",
			"$id":"urn:example:events:order.shipped:v1","type":"object",
			"required":["order_id"],"properties":{"order_id":{"type":"string","format":"uuid"}}}`),
		Example: json.RawMessage(`{"order_id":"0195f3a2-7c4e-7b1a-9d2f-3c8e5a6b1f40"}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	shipped, _ := catalog.Lookup("order.shipped")
	fmt.Println(catalog.Names(), shipped.SchemaID())
	_, known := catalog.Lookup("order.shiped")
	fmt.Println(known)
	// Output:
	// [order.shipped] urn:example:events:order.shipped:v1
	// false
}
