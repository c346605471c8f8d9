package relayworker

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every variable the worker reads is in docs/reference.md: a setting added
// without its documentation fails here.
func TestEveryVariableReadIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/reference.md")
	require.NoError(t, err)
	var read []string
	_, _ = parseConfig(func(name string) string {
		read = append(read, name)
		return ""
	}, nil)
	require.Contains(t, read, "OUTBOX_DESTINATION_CONCURRENCY", "the spy sees the reads")
	for _, name := range slices.Compact(slices.Sorted(slices.Values(read))) {
		require.True(t, strings.Contains(string(doc), "`"+name+"`"), "docs/reference.md does not document %s", name)
	}
}
