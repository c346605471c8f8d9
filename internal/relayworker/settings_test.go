package relayworker

import (
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite docs/reference.md's worker settings table")

// The worker's settings table in docs/reference.md is generated from
// the settings table here, defaults included, so the two cannot drift.
// go test ./internal/relayworker -update rewrites it.
func TestConfigurationDocIsCurrent(t *testing.T) {
	const path = "../../docs/reference.md"
	const begin, end = "<!-- worker settings: begin -->\n", "<!-- worker settings: end -->"
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	before, rest, ok := strings.Cut(doc, begin)
	require.True(t, ok, "%s lacks %q", path, begin)
	current, after, ok := strings.Cut(rest, end)
	require.True(t, ok, "%s lacks %q", path, end)
	want := settingsTable()
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(before+begin+want+end+after), 0o644))
		return
	}
	require.Equal(t, want, current, "docs/reference.md is out of date: go test ./internal/relayworker -update")
}

func TestFormatDurationAsAPersonWould(t *testing.T) {
	t.Parallel()
	for d, want := range map[string]string{"5s": "5s", "10s": "10s", "5m": "5m", "2h": "2h", "168h": "168h", "50ms": "50ms", "1m30s": "1m30s"} {
		got, err := time.ParseDuration(d)
		require.NoError(t, err)
		require.Equal(t, want, formatDuration(got))
	}
}
