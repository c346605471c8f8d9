package openapi_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/openapi"
)

// clientRuntime is the version of oapi-codegen's runtime library the
// generated client is built with, as a client's module would require it.
const clientRuntime = "v1.9.0"

// The description is a valid OpenAPI 3.1 document (the specification's
// own schema says so), not only YAML that tests happen to read.
func TestTheDescriptionIsValidOpenAPI31(t *testing.T) {
	t.Parallel()
	doc, err := libopenapi.NewDocument(openapi.Description)
	require.NoError(t, err)
	require.Equal(t, "3.1.0", doc.GetVersion(), "the description is OpenAPI 3.1")
	v, errs := validator.NewValidator(doc)
	require.Empty(t, errs)
	ok, verrs := v.ValidateDocument()
	for _, e := range verrs {
		t.Errorf("%s: %s (line %d)", e.Message, e.Reason, e.SpecLine)
	}
	require.True(t, ok, "openapi/openapi.yaml is valid against the OpenAPI 3.1 schema")
}

// A client generated from the description, by a generator people use
// (oapi-codegen, pinned in tools/go.mod), compiles and vets: the
// description is usable, not only valid.
func TestAGeneratedClientCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own")
	}
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
		return string(out)
	}
	// Written by the generator itself: what the go command says on the
	// way (downloading the generator's modules on a fresh machine) is not
	// part of the file.
	client := filepath.Join(dir, "client.go")
	run("go", "-C", root, "tool", "-modfile=tools/go.mod", "oapi-codegen",
		"-generate", "types,client", "-package", "ordersclient", "-o", client, "openapi/openapi.yaml")
	b, err := os.ReadFile(client)
	require.NoError(t, err)
	generated := string(b)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/ordersclient\n\ngo 1.26\n"), 0o644))
	run("go", "get", "github.com/oapi-codegen/runtime@"+clientRuntime)
	run("go", "mod", "tidy")
	run("go", "vet", "./...")
	for _, want := range []string{"func (c *Client) PlaceOrder(", "func (c *Client) CreateEndpoint(", "func (c *Client) ListEventTypes(", "type Order struct"} {
		require.Contains(t, generated, want, "the client has each operation and type")
	}
}

// A receiver reads an event's schema, and its version, from the
// description.
func TestEventSchemaReadsTheWebhooks(t *testing.T) {
	t.Parallel()
	schema, version, err := openapi.EventSchema("order.placed")
	require.NoError(t, err)
	require.Equal(t, 1, version)
	require.Contains(t, string(schema), `"customer_id"`)
	_, _, err = openapi.EventSchema("order.unknown")
	require.ErrorIs(t, err, openapi.ErrUnknownEventType)
}
