package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// EventType is one type of event a module emits, as receivers see it: the
// contract its data keeps. Modules declare theirs (orders.EventTypes); the
// programs gather them into one Catalog. The outbox owns the type and not
// the list, since it imports no module: each module fills in its own.
type EventType struct {
	// Name is the type events carry, such as "order.placed".
	Name string
	// Version is raised, from 1, by a change receivers could not read
	// with their code for the previous one: a field removed, retyped or
	// newly required. Additive changes keep it.
	Version int
	// Description says in one line when the event happens.
	Description string
	// Schema is the JSON Schema (draft 2020-12) of the event's data. Its
	// $id names the type and version: it is the CloudEvents dataschema of
	// the event's broker messages.
	Schema json.RawMessage
	// Example is the data of one such event, valid against Schema.
	Example json.RawMessage
}

// SchemaID is the schema's $id: the URI of this version of the type's
// data, "" if the schema has none.
func (t EventType) SchemaID() string {
	var s struct {
		ID string `json:"$id"`
	}
	_ = json.Unmarshal(t.Schema, &s)
	return s.ID
}

// jsonSchemaDraft is the dialect every schema declares.
const jsonSchemaDraft = "https://json-schema.org/draft/2020-12/schema"

// ErrInvalidCatalog is returned by NewCatalog for event types that cannot
// make a catalog: a name given twice, or an entry without what receivers
// need.
var ErrInvalidCatalog = errors.New("outbox: invalid event catalog")

// Catalog is every event type the product emits: what endpoints may
// subscribe to, what GET /event-types lists, and what the OpenAPI
// description's webhooks publish.
type Catalog struct {
	types []EventType
}

// NewCatalog checks the modules' event types and returns them as one
// catalog, sorted by name. A type must have a name, a version from 1, a
// one-line description, a draft 2020-12 JSON Schema whose $id ends with
// ":<name>:v<version>" (so a raised version is a new URI) and an example.
func NewCatalog(types ...EventType) (*Catalog, error) {
	c := &Catalog{types: slices.Clone(types)}
	slices.SortFunc(c.types, func(a, b EventType) int { return strings.Compare(a.Name, b.Name) })
	for i, t := range c.types {
		if err := t.check(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidCatalog, err)
		}
		if i > 0 && c.types[i-1].Name == t.Name {
			return nil, fmt.Errorf("%w: %q is declared twice", ErrInvalidCatalog, t.Name)
		}
	}
	return c, nil
}

// check refuses an entry a receiver could not use.
func (t EventType) check() error {
	switch {
	case t.Name == "" || strings.TrimSpace(t.Name) != t.Name:
		return fmt.Errorf("event type %q: a name without spaces around it is required", t.Name)
	case t.Version < 1:
		return fmt.Errorf("%s: version %d: versions start at 1", t.Name, t.Version)
	case strings.TrimSpace(t.Description) == "" || strings.ContainsAny(t.Description, "\r\n"):
		return fmt.Errorf("%s: the description is one line, and required", t.Name)
	case !json.Valid(t.Example) || len(t.Example) == 0:
		return fmt.Errorf("%s: the example is not JSON", t.Name)
	}
	var s struct {
		Dialect string `json:"$schema"`
		ID      string `json:"$id"`
	}
	if err := json.Unmarshal(t.Schema, &s); err != nil {
		return fmt.Errorf("%s: the schema is not a JSON object: %w", t.Name, err)
	}
	if s.Dialect != jsonSchemaDraft {
		return fmt.Errorf("%s: the schema's $schema is %q, want %q", t.Name, s.Dialect, jsonSchemaDraft)
	}
	if suffix := fmt.Sprintf(":%s:v%d", t.Name, t.Version); !strings.HasSuffix(s.ID, suffix) {
		return fmt.Errorf("%s: the schema's $id %q does not end with %q", t.Name, s.ID, suffix)
	}
	return nil
}

// Types returns the catalog's event types, sorted by name.
func (c *Catalog) Types() []EventType { return slices.Clone(c.types) }

// Names returns the catalog's type names, sorted.
func (c *Catalog) Names() []string {
	names := make([]string, len(c.types))
	for i, t := range c.types {
		names[i] = t.Name
	}
	return names
}

// Lookup returns the event type named name.
func (c *Catalog) Lookup(name string) (EventType, bool) {
	i, found := slices.BinarySearchFunc(c.types, name, func(t EventType, name string) int { return strings.Compare(t.Name, name) })
	if !found {
		return EventType{}, false
	}
	return c.types[i], true
}
