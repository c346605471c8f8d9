package apiserver

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/proctest"
)

// Every variable the api reads is in docs/reference.md: a setting added
// without its documentation fails here.
func TestEveryVariableReadIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/reference.md")
	require.NoError(t, err)
	read := proctest.VariablesRead(func(getenv func(string) string) { _, _ = parseConfig(getenv, nil) })
	require.Contains(t, read, "ADMIN_TOKEN", "the spy sees the reads")
	for _, name := range read {
		require.True(t, strings.Contains(string(doc), "`"+name+"`"), "docs/reference.md does not document %s", name)
	}
}
