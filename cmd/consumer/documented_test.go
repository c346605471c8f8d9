package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/proctest"
)

// Every variable the consumer reads is in its package documentation, the
// lists a reader of `go doc` sees (main.go's, and nats.go's for the
// JetStream stream): a setting added without it fails here.
func TestEveryVariableReadIsDocumented(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var documented []string
	for _, file := range files {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments|parser.PackageClauseOnly)
		require.NoError(t, err)
		if f.Doc == nil {
			continue
		}
		for _, m := range regexp.MustCompile(`(?m)^\t([A-Z][A-Z0-9_]+)\b`).FindAllStringSubmatch(f.Doc.Text(), -1) {
			documented = append(documented, m[1])
		}
	}
	read := proctest.VariablesRead(func(getenv func(string) string) { _, _ = parseConfig(getenv, nil) })
	require.Contains(t, read, "CONSUMER_INBOX_RETENTION", "the spy sees the reads")
	for _, name := range read {
		require.Contains(t, documented, name, "cmd/consumer's package documentation does not list %s", name)
	}
}
