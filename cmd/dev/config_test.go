package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/proctest"
)

// Every variable dev reads itself is in docs/reference.md, beside the api's
// and the worker's.
func TestEveryVariableReadIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/reference.md")
	require.NoError(t, err)
	read := proctest.VariablesRead(func(getenv func(string) string) { _, _ = parseConfig(getenv, nil) })
	require.Contains(t, read, "DEV_RECEIVER_ADDR", "the spy sees the reads")
	for _, name := range read {
		require.True(t, strings.Contains(string(doc), "`"+name+"`"), "docs/reference.md does not document %s", name)
	}
}

// A misspelt DEV_ variable is named with the one meant; the others are left
// to the api and the worker, which warn of the names they read, so that no
// warning is said twice.
func TestMisspeltDevVariablesAreNamed(t *testing.T) {
	t.Parallel()
	environ := []string{"DEV_RECIEVER=false", "OUTBOX_MAX_ATTEMPT=3", "DATABASE_URI=postgres://x@127.0.0.1:1/db"}
	c, err := parseConfig(func(name string) string { return "" }, environ)
	require.NoError(t, err)
	require.Equal(t, []string{"DEV_RECIEVER is set but nothing reads it: did you mean DEV_RECEIVER?"}, c.misspelt)
}
