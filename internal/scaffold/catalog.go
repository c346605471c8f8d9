package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/format"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// schemaURN starts the $id of every event schema the catalog holds: the
// service's CloudEvents source (a copy's own, as new:service renames it).
const schemaURN = "urn:outboxkit:orders"

// catalogList is where internal/events gathers the modules' entries.
const catalogList = "catalog, catalogErr = outbox.NewCatalog(slices.Concat(\n"

// addToCatalog adds event type typ of module mod to the event catalog, as
// the orders module keeps its own entries: a schema skeleton
// (internal/MODULE/events/TYPE.schema.json) and an example
// (TYPE.example.json) to fill in, an entry in the module's EventTypes
// (internal/MODULE/eventtypes.go, created with the module's first), and the
// module in internal/events' list. root is the repository's root, where
// go.mod names the module path. It reports what it wrote.
func addToCatalog(root, mod, typ string) (string, error) {
	modPath, err := modulePath(root)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "internal", mod)
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		return "", err
	}
	schema := filepath.Join(dir, "events", typ+".schema.json")
	example := filepath.Join(dir, "events", typ+".example.json")
	for _, f := range []struct{ path, body string }{
		{schema, strings.NewReplacer("TYPE", typ, "URN", schemaURN).Replace(schemaTemplate)},
		{example, "{}\n"},
	} {
		if _, err := os.Stat(f.path); err == nil {
			return "", fmt.Errorf("%s exists", f.path)
		}
		if err := os.WriteFile(f.path, []byte(f.body), 0o644); err != nil {
			return "", err
		}
	}

	types := filepath.Join(dir, "eventtypes.go")
	src, err := os.ReadFile(types)
	if errors.Is(err, fs.ErrNotExist) {
		src, err = []byte(strings.NewReplacer("PKG", mod, "MODPATH", modPath).Replace(eventTypesTemplate)), nil
	}
	if err != nil {
		return "", err
	}
	entry := fmt.Sprintf("\t{\n\t\tName: %s, Version: 1,\n\t\tDescription: \"TODO: when it happens, in one line.\",\n"+
		"\t\tSchema: eventFile(%q), Example: eventFile(%q),\n\t},\n",
		eventConstant(mod, typ), typ+".schema.json", typ+".example.json")
	out, ok := insertBefore(string(src), "var EventTypes = []outbox.EventType{", "\n}\n", "\n"+strings.TrimSuffix(entry, "\n"))
	if !ok {
		return "", fmt.Errorf("%s: no var EventTypes = []outbox.EventType{...} to add %s to", types, typ)
	}
	if err := writeGo(types, out); err != nil {
		return "", err
	}

	list := filepath.Join(root, "internal", "events", "events.go")
	src, err = os.ReadFile(list)
	if err != nil {
		return "", err
	}
	if !bytes.Contains(src, []byte("\t"+mod+".EventTypes,")) {
		s, ok := insertBefore(string(src), catalogList, ")...)", "\t"+mod+".EventTypes,\n")
		if !ok {
			return "", fmt.Errorf("%s: no %q to add %s's event types to", list, strings.TrimSpace(catalogList), mod)
		}
		imp := fmt.Sprintf("\t%q\n", modPath+"/internal/"+mod)
		if s, ok = insertBefore(s, "import (", "\n)", "\n"+strings.TrimSuffix(imp, "\n")); !ok {
			return "", fmt.Errorf("%s: no import block", list)
		}
		if err := writeGo(list, s); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("added %s to the event catalog: fill in %s and %s, then ./task generate", typ, schema, example), nil
}

// writeGo formats src and writes it to path.
func writeGo(path, src string) error {
	b, err := format.Source([]byte(src))
	if err != nil {
		return fmt.Errorf("formatting %s: %w", path, err)
	}
	return os.WriteFile(path, b, 0o644)
}

// schemaTemplate is a new event type's schema: an object whose fields are
// still to be named.
const schemaTemplate = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "URN:events:TYPE:v1",
  "title": "TYPE data",
  "description": "TODO: what the event's data holds.",
  "type": "object",
  "required": [],
  "properties": {}
}
`

// eventTypesTemplate is a module's eventtypes.go before its first entry.
const eventTypesTemplate = `package PKG

import (
	"embed"
	"encoding/json"

	"MODPATH/internal/outbox"
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
}
`
