package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// WithCatalog makes the service refuse subscriptions to types the catalog
// lacks (ErrInvalidEndpoint, naming the known ones) and list the catalog
// (EventTypes). Without it any type may be subscribed to: the outbox
// knows no module's events, and the programs that wire the modules pass
// their catalog.
//
// Endpoints stored before a type left the catalog keep it: their other
// types are delivered as before, a change that leaves event_types out
// keeps it, and a change that names event_types must name known types
// only, which is how an operator drops it. EventTypes lists it as unknown
// with its subscribers.
func WithCatalog(c *outbox.Catalog) Option {
	return func(a *Service) { a.catalog = c }
}

// known reports whether subscriptions may name typ.
func (a *Service) known(typ string) bool {
	if a.catalog == nil {
		return true
	}
	_, ok := a.catalog.Lookup(typ)
	return ok
}

// EventType is a type of the catalog with the endpoints subscribed to it.
type EventType struct {
	outbox.EventType
	// Subscribers are the endpoints that name the type.
	Subscribers []Endpoint
}

// Subscriptions is the catalog as the ops page shows it: each type with
// its subscribers, and the types that subscriptions name but the catalog
// lacks (left from a type no module emits any more), with theirs.
type Subscriptions struct {
	Types   []EventType
	Unknown []EventType
}

// EventTypes returns the catalog (empty without WithCatalog), sorted by
// name.
func (a *Service) EventTypes() []outbox.EventType {
	if a.catalog == nil {
		return []outbox.EventType{}
	}
	return a.catalog.Types()
}

// Subscriptions returns each type of the catalog with the endpoints
// subscribed to it, and the types endpoints name that it lacks.
func (a *Service) Subscriptions(ctx context.Context) (Subscriptions, error) {
	rows, err := outboxdb.New(a.pool).EndpointList(ctx)
	if err != nil {
		return Subscriptions{}, fmt.Errorf("listing endpoints: %w", err)
	}
	var s Subscriptions
	byType := map[string][]Endpoint{}
	for _, r := range rows {
		for _, t := range r.EventTypes {
			byType[t] = append(byType[t], toEndpoint(r))
		}
	}
	for _, t := range a.EventTypes() {
		s.Types = append(s.Types, EventType{EventType: t, Subscribers: byType[t.Name]})
		delete(byType, t.Name)
	}
	if a.catalog == nil {
		return s, nil
	}
	for _, name := range slices.Sorted(maps.Keys(byType)) {
		s.Unknown = append(s.Unknown, EventType{EventType: outbox.EventType{Name: name}, Subscribers: byType[name]})
	}
	return s, nil
}

// eventType is an entry of GET /event-types.
type eventType struct {
	Type        string          `json:"type"`
	Version     int             `json:"version"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Example     json.RawMessage `json:"example"`
}

func (a *Service) handleEventTypes(w http.ResponseWriter, _ *http.Request) {
	types := a.EventTypes()
	out := make([]eventType, len(types))
	for i, t := range types {
		out[i] = eventType{Type: t.Name, Version: t.Version, Description: t.Description, Schema: t.Schema, Example: t.Example}
	}
	httpjson.Write(w, http.StatusOK, out)
}
