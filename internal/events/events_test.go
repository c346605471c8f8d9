package events_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/orders/internal/events"
	"github.com/outboxkit/orders/internal/events/eventstest"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/openapi"
)

// update rewrites openapi/openapi.yaml's webhooks from the catalog (./task
// generate), refusing a breaking change that keeps its version.
var update = flag.Bool("update", false, "write the catalog's webhooks into openapi/openapi.yaml")

const descriptionFile = "../../openapi/openapi.yaml"

// Each entry of the catalog is usable by a receiver: its schema compiles
// as draft 2020-12 and its example is valid against it, closed (the
// example names no field its schema lacks).
func TestEveryExampleMatchesItsSchema(t *testing.T) {
	t.Parallel()
	types := events.Catalog().Types()
	require.NotEmpty(t, types)
	for _, et := range types {
		require.NoError(t, eventstest.ValidEvent(et.Name, et.Example), "%s: the example is valid against the schema", et.Name)
	}
	_, known := events.Catalog().Lookup("order.placed")
	require.True(t, known, "the orders module's events are in the catalog")
}

// The tests' check of emitted events refuses what receivers could not
// rely on: a field the schema does not name (closed, though receivers
// take new fields), a field of another type, a type the catalog lacks.
func TestEmittedEventsAreHeldToTheirSchemaClosed(t *testing.T) {
	t.Parallel()
	placed, _ := events.Catalog().Lookup("order.placed")
	var data map[string]any
	require.NoError(t, json.Unmarshal(placed.Example, &data))
	with := func(k string, v any) []byte {
		m := maps.Clone(data)
		m[k] = v
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return b
	}
	require.NoError(t, eventstest.ValidEvent("order.placed", placed.Example))
	require.Error(t, eventstest.ValidEvent("order.placed", with("coupon", "FREE")), "a field the schema does not name")
	require.Error(t, eventstest.ValidEvent("order.placed", with("total_cents", "1250")), "a retyped field")
	require.Error(t, eventstest.ValidEvent("order.placed", with("id", "not-a-uuid")), "formats are asserted")
	require.Error(t, eventstest.ValidEvent("order.unknown", placed.Example), "a type the catalog lacks")
}

// The description's webhooks are the catalog: one per type, with its
// version, description, schema and example, as `./task generate` writes
// them. A schema changed without it fails here, and the diff of
// openapi/openapi.yaml is where a reviewer sees the change.
func TestDescriptionPublishesTheCatalog(t *testing.T) {
	doc, err := os.ReadFile(descriptionFile)
	require.NoError(t, err)
	head, published, found := bytes.Cut(doc, []byte("\nwebhooks:\n"))
	if !found {
		head, published = doc, nil
	}
	want, err := webhooks(events.Catalog())
	require.NoError(t, err)
	if *update {
		for _, et := range events.Catalog().Types() {
			if reasons := breaking(t, et); len(reasons) > 0 {
				t.Fatalf("%s: not written: %s", et.Name, strings.Join(reasons, "; "))
			}
		}
		require.NoError(t, os.WriteFile(descriptionFile, slices.Concat(bytes.TrimRight(head, "\n"), []byte("\n"), want), 0o644))
		return
	}
	require.Equal(t, string(want), "webhooks:\n"+string(published),
		"openapi/openapi.yaml's webhooks are not the catalog's: run ./task generate (go test ./internal/events -run TestDescriptionPublishesTheCatalog -update)")
}

// A schema change that breaks receivers (a field removed or retyped, a
// field newly required) raises the type's version; an additive one does
// not need to. Compared with the schema the description publishes, the
// last one reviewed.
func TestSchemaChangesThatBreakReceiversRaiseTheVersion(t *testing.T) {
	t.Parallel()
	for _, et := range events.Catalog().Types() {
		require.Empty(t, breaking(t, et), "%s v%d breaks receivers of the published schema: raise its version (docs/reference.md, Event types)", et.Name, et.Version)
	}
}

// The rule itself, on schemas made for it.
func TestTheBreakingChangeRule(t *testing.T) {
	t.Parallel()
	old := `{"type":"object","required":["id"],"properties":{
		"id":{"type":"string","format":"uuid"},
		"total":{"type":"integer"},
		"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"}}}}}}`
	tests := []struct {
		name, new string
		want      []string
	}{
		{"unchanged", old, nil},
		{"a field added", strings.Replace(old, `"total":`, `"note":{"type":"string"},"total":`, 1), nil},
		{"a requirement dropped", strings.Replace(old, `"required":["id"]`, `"required":[]`, 1), nil},
		{"a field removed", strings.Replace(old, `"total":{"type":"integer"},`, ``, 1), []string{"total: removed"}},
		{"a field retyped", strings.Replace(old, `"total":{"type":"integer"}`, `"total":{"type":"string"}`, 1), []string{"total: retyped"}},
		{"a format changed", strings.Replace(old, `"format":"uuid"`, `"format":"date-time"`, 1), []string{"id: retyped"}},
		{"a field newly required", strings.Replace(old, `"required":["id"]`, `"required":["id","total"]`, 1), []string{"total: newly required"}},
		{"a nested field removed", strings.Replace(old, `"sku":{"type":"string"}`, ``, 1), []string{"lines[].sku: removed"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := changes("", decode(t, []byte(old)), decode(t, []byte(tc.new)))
			require.Len(t, got, len(tc.want), "%v", got)
			for i, w := range tc.want {
				require.Contains(t, got[i], w)
			}
		})
	}
}

// breaking is why et's schema breaks receivers of the one the description
// publishes for its type at the same version; nothing for a new type, a
// raised version or an additive change. A lowered version is refused.
func breaking(t *testing.T, et outbox.EventType) []string {
	t.Helper()
	published, version, err := openapi.EventSchema(et.Name)
	if err != nil {
		return nil // a new type: nothing to break
	}
	switch {
	case et.Version < version:
		return []string{fmt.Sprintf("version %d is below the published %d", et.Version, version)}
	case et.Version > version:
		return nil
	}
	return changes("", decode(t, published), decode(t, et.Schema))
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// changes lists what in new breaks a reader of old, at path: its fields
// removed, retyped (type, format or const), newly required; into objects'
// properties and arrays' items.
func changes(path string, old, new map[string]any) []string {
	var out []string
	at := func(name string) string { return strings.TrimPrefix(path+"."+name, ".") }
	if sig(old) != sig(new) {
		out = append(out, fmt.Sprintf("%s: retyped from %s to %s", cmpPath(path), sig(old), sig(new)))
	}
	oldProps, _ := old["properties"].(map[string]any)
	newProps, _ := new["properties"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(oldProps)) {
		n, ok := newProps[name].(map[string]any)
		if !ok {
			out = append(out, at(name)+": removed")
			continue
		}
		o, _ := oldProps[name].(map[string]any)
		out = append(out, changes(at(name), o, n)...)
	}
	wasRequired := map[string]bool{}
	for _, r := range asList(old["required"]) {
		wasRequired[r] = true
	}
	for _, r := range asList(new["required"]) {
		if !wasRequired[r] {
			out = append(out, at(r)+": newly required")
		}
	}
	oi, _ := old["items"].(map[string]any)
	ni, _ := new["items"].(map[string]any)
	if oi != nil && ni != nil {
		out = append(out, changes(path+"[]", oi, ni)...)
	}
	return out
}

func cmpPath(p string) string {
	if p == "" {
		return "data"
	}
	return p
}

// sig is what a reader of a value relies on: its type, format and const.
func sig(s map[string]any) string {
	b, _ := json.Marshal([]any{s["type"], s["format"], s["const"]})
	return string(b)
}

func asList(v any) []string {
	var out []string
	list, _ := v.([]any)
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// webhooks writes the description's webhooks section for the catalog:
// the body the relay sends (docs/reference.md, Webhooks), its data the
// type's schema.
func webhooks(c *outbox.Catalog) ([]byte, error) {
	hooks := mapping()
	for _, et := range c.Types() {
		schema, err := node(et.Schema)
		if err != nil {
			return nil, fmt.Errorf("%s: schema: %w", et.Name, err)
		}
		example, err := node(et.Example)
		if err != nil {
			return nil, fmt.Errorf("%s: example: %w", et.Name, err)
		}
		header := func(name, desc string) *yaml.Node {
			return mapping("name", name, "in", "header", "required", true, "description", desc, "schema", mapping("type", "string"))
		}
		envelope := mapping("type", "object", "required", seq("id", "type", "created_at", "data"), "properties", mapping(
			"id", mapping("type", "string", "format", "uuid", "description", "The event's id: the webhook-id."),
			"type", mapping("const", et.Name),
			"created_at", mapping("type", "string", "format", "date-time", "description", "When the event was written."),
			"data", schema,
		))
		add(hooks, et.Name, mapping("post", mapping(
			"operationId", "event_"+strings.NewReplacer(".", "_", "-", "_").Replace(et.Name),
			"summary", et.Name,
			"description", et.Description,
			"x-event-version", et.Version,
			"parameters", seq(
				header("webhook-id", "The event's id, the same on every retry and replay and for every endpoint: deduplicate on it."),
				header("webhook-timestamp", "Unix seconds."),
				header("webhook-signature", "v1,<base64 HMAC-SHA256 of {webhook-id}.{webhook-timestamp}.{body}>, keyed with the secret; two, space-separated, during a rotation's overlap."),
			),
			"requestBody", mapping("required", true, "content", mapping("application/json", mapping(
				"schema", envelope,
				"example", mapping("id", "0195f3a2-7c4e-7b1a-9d2f-3c8e5a6b1f41", "type", et.Name, "created_at", "2026-03-01T12:00:00.123456Z", "data", example),
			))),
			"responses", mapping(
				"2XX", mapping("description", "Delivered."),
				"410", mapping("description", "The endpoint is paused: its messages wait until it is enabled."),
				"429", mapping("description", "The endpoint waits Retry-After, then the message is retried."),
				"default", mapping("description", "A failed attempt, retried on the schedule (docs/reference.md, Webhooks)."),
			),
		)))
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(mapping("webhooks", hooks)); err != nil {
		return nil, err
	}
	return buf.Bytes(), enc.Close()
}

// node reads JSON as a YAML node in block style, its keys in their order.
func node(b []byte) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	var block func(n *yaml.Node)
	block = func(n *yaml.Node) {
		n.Style &^= yaml.FlowStyle | yaml.DoubleQuotedStyle
		for _, c := range n.Content {
			block(c)
		}
	}
	block(doc.Content[0])
	return doc.Content[0], nil
}

func mapping(kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		add(m, kv[i].(string), kv[i+1])
	}
	return m
}

func add(m *yaml.Node, key string, v any) {
	m.Content = append(m.Content, scalar(key), value(v))
}

func seq(vs ...any) *yaml.Node {
	s := &yaml.Node{Kind: yaml.SequenceNode}
	for _, v := range vs {
		s.Content = append(s.Content, value(v))
	}
	return s
}

func value(v any) *yaml.Node {
	switch v := v.(type) {
	case *yaml.Node:
		return v
	case string:
		return scalar(v)
	default:
		var n yaml.Node
		if err := n.Encode(v); err != nil {
			panic(err)
		}
		return &n
	}
}

func scalar(s string) *yaml.Node {
	var n yaml.Node
	_ = n.Encode(s)
	return &n
}
