// Package eventstest holds the events the tests make the product emit to
// the event catalog: each of a test's events (CheckEvents) must be of a
// type of the catalog, and its data valid against the type's schema.
package eventstest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxkit/orders/internal/events"
)

// CheckEvents checks, when t ends, every event written in the database at
// databaseURL (outbox_events: what the product emitted while t ran, as its
// modules enqueued it) against the catalog: its type must be the
// catalog's and its data valid against the type's schema, closed (no
// field the schema does not name: receivers must take new fields, the
// product must describe every field it sends). Call it after the
// database is made, so it runs before the database is dropped.
func CheckEvents(t testing.TB, databaseURL string) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, databaseURL)
		if err != nil {
			t.Errorf("reading the events emitted: %v", err)
			return
		}
		defer pool.Close()
		rows, err := pool.Query(ctx, `SELECT id::text, type, payload::text FROM outbox_events ORDER BY id`)
		if err != nil {
			t.Errorf("reading the events emitted: %v", err)
			return
		}
		type event struct{ id, typ, data string }
		evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (event, error) {
			var e event
			return e, r.Scan(&e.id, &e.typ, &e.data)
		})
		if err != nil {
			t.Errorf("reading the events emitted: %v", err)
			return
		}
		for _, e := range evs {
			if err := ValidEvent(e.typ, []byte(e.data)); err != nil {
				t.Errorf("event %s emitted: %v\ndata: %.500s", e.id, err, e.data)
			}
		}
	})
}

// schemas are the catalog's schemas, closed and compiled, by type.
var schemas = sync.OnceValues(func() (map[string]*jsonschema.Schema, error) {
	out := map[string]*jsonschema.Schema{}
	for _, et := range events.Catalog().Types() {
		s, err := compile(et.Schema)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", et.Name, err)
		}
		out[et.Name] = s
	}
	return out, nil
})

// ValidEvent reports whether data is valid for an event of type typ: typ
// in the catalog, data valid against its schema, closed.
func ValidEvent(typ string, data []byte) error {
	all, err := schemas()
	if err != nil {
		return err
	}
	s, ok := all[typ]
	if !ok {
		return fmt.Errorf("type %q is not in the event catalog (%s)", typ, strings.Join(events.Catalog().Names(), ", "))
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: data is not JSON: %w", typ, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s: data does not match its schema: %w", typ, err)
	}
	return nil
}

// compile compiles a JSON Schema (draft 2020-12), closed (every object
// schema that names properties and says nothing of others gets
// additionalProperties: false), asserting formats.
func compile(schema []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("reading the schema: %w", err)
	}
	closeObjects(doc)
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("schema.json")
}

// closeObjects closes every object schema in v that lists properties.
func closeObjects(v any) {
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v["properties"]; ok {
			if _, set := v["additionalProperties"]; !set {
				v["additionalProperties"] = false
			}
		}
		for _, child := range v {
			closeObjects(child)
		}
	case []any:
		for _, child := range v {
			closeObjects(child)
		}
	}
}
