package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// new:event adds the type to the event catalog as the orders module keeps
// its own: a schema skeleton and an example to fill in, an entry in the
// module's EventTypes, and the module in internal/events' list, once.
func TestNewEventAddsTheCatalogEntry(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(rel, body string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, rel)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, rel), []byte(body), 0o644))
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err)
		return string(b)
	}
	write("go.mod", "module example.com/shop\n")
	events, err := os.ReadFile(filepath.Join("..", "events", "events.go"))
	require.NoError(t, err, "the catalog's list, as the template has it")
	write("internal/events/events.go", strings.ReplaceAll(string(events), "github.com/outboxkit/orders", "example.com/shop"))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "internal", "payments"), 0o755))

	for _, typ := range []string{"payment.captured", "payment.refunded"} {
		report, err := addToCatalog(root, "payments", typ)
		require.NoError(t, err)
		require.Contains(t, report, "./task generate", "it says what to do next")
		schema := read("internal/payments/events/" + typ + ".schema.json")
		require.Contains(t, schema, `"$id": "`+schemaURN+`:events:`+typ+`:v1"`, "the $id the catalog requires")
		require.Contains(t, schema, `"$schema": "https://json-schema.org/draft/2020-12/schema"`)
		require.Equal(t, "{}\n", read("internal/payments/events/"+typ+".example.json"))
	}
	types := read("internal/payments/eventtypes.go")
	for _, want := range []string{`"example.com/shop/internal/outbox"`, "//go:embed events",
		`Name: EventCaptured, Version: 1`, `eventFile("payment.captured.schema.json"), Example: eventFile("payment.captured.example.json")`,
		`Name: EventRefunded, Version: 1`} {
		require.Contains(t, types, want)
	}
	list := read("internal/events/events.go")
	require.Equal(t, 1, strings.Count(list, "\tpayments.EventTypes,"), "the module is listed once:\n%s", list)
	require.Contains(t, list, `"example.com/shop/internal/payments"`)
	require.Contains(t, list, "orders.EventTypes,\n\tpayments.EventTypes,\n", "after the modules before it")

	_, err = addToCatalog(root, "payments", "payment.captured")
	require.Error(t, err, "a type is added once")
}
