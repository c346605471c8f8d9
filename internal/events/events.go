// Package events is the product's event catalog: every event type its
// modules emit, gathered into one outbox.Catalog for the programs that
// wire them (the api's subscriptions, GET /event-types and the ops page;
// the worker's broker messages) and for the tests that hold the OpenAPI
// description and the emitted events to it.
//
// The outbox owns the catalog's type and imports no module; each module
// declares its own event types beside its events; this package, like the
// programs, may import every module, and lists them: a new module's
// EventTypes are added here (./task new:event does it).
package events

import (
	"slices"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox"
)

// catalog is built once: the entries are constants of the build.
var catalog, catalogErr = outbox.NewCatalog(slices.Concat(
	orders.EventTypes,
)...)

// Catalog returns the product's event catalog. It panics if a module
// declares an invalid entry: a defect of the build that every test of
// the programs finds before a release could.
func Catalog() *outbox.Catalog {
	if catalogErr != nil {
		panic(catalogErr)
	}
	return catalog
}
