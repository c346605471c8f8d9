package process_test

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/process"
)

// read returns an Env that has read names, as a process's parseConfig does.
func read(environ []string, names ...string) *process.Env {
	env := process.NewEnv(process.Getenv(environ))
	for _, name := range names {
		env.String(name, "")
	}
	return env
}

// A variable set but never read is named when it is a slip of the keyboard
// away from one that is read, and only then.
func TestMisspeltNamesTheVariableMeant(t *testing.T) {
	t.Parallel()
	names := []string{"OUTBOX_MAX_ATTEMPTS", "OUTBOX_DELIVERY_TIMEOUT", "DATABASE_URL", "OUTBOX_NOTIFY"}
	tests := []struct {
		set  string
		want string // "" when nothing is said
	}{
		{"OUTBOX_MAX_ATTEMPT=20", "OUTBOX_MAX_ATTEMPT is set but nothing reads it: did you mean OUTBOX_MAX_ATTEMPTS?"},
		{"OUTBOX_DELIVERY_TIMOUT=30s", "OUTBOX_DELIVERY_TIMOUT is set but nothing reads it: did you mean OUTBOX_DELIVERY_TIMEOUT?"},
		{"OUTBOX_DELIVREY_TIMEOUT=30s", "OUTBOX_DELIVREY_TIMEOUT is set but nothing reads it: did you mean OUTBOX_DELIVERY_TIMEOUT?"},
		{"DATABSE_URL=postgres://x", "DATABSE_URL is set but nothing reads it: did you mean DATABASE_URL?"},
		{"outbox_notify=true", ""},          // case differs in every letter: not a slip
		{"OUTBOX_NOTIFY=true", ""},          // read
		{"OUTBOX_MAX_ATTEMPT=", ""},         // set to nothing, as good as unset
		{"OUTBOX_STALL_THRESHOLD=1m", ""},   // another process's: far from every name read
		{"OTEL_EXPORTER_OTLP_HEADER=x", ""}, // the OpenTelemetry SDK's to read
		{"HOME=/root", ""},
	}
	for _, tc := range tests {
		environ := []string{tc.set}
		got := read(environ, names...).Misspelt(environ)
		if tc.want == "" {
			require.Empty(t, got, tc.set)
		} else {
			require.Equal(t, []string{tc.want}, got, tc.set)
		}
	}
}

// The first of a repeated name wins, as with os.Getenv.
func TestGetenvTakesTheFirstOfARepeatedName(t *testing.T) {
	t.Parallel()
	getenv := process.Getenv([]string{"A=1", "B=x=y", "A=2", "EMPTY="})
	require.Equal(t, "1", getenv("A"))
	require.Equal(t, "x=y", getenv("B"), "a value may hold =")
	require.Empty(t, getenv("EMPTY"))
	require.Empty(t, getenv("UNSET"))
}

// The api and the worker may share one environment: each must not take a
// variable the other reads for a misspelling of its own. Every variable
// either reads is documented (TestEveryVariableReadIsDocumented in each), so
// it is enough that no documented variable is taken for a misspelling of
// another.
func TestNoDocumentedVariableLooksLikeAMisspellingOfAnother(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/reference.md")
	require.NoError(t, err)
	var names []string
	for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9]*_[A-Z0-9_]+)`").FindAllStringSubmatch(string(doc), -1) {
		names = append(names, m[1])
	}
	names = slices.Compact(slices.Sorted(slices.Values(names)))
	require.Contains(t, names, "OUTBOX_BACKOFF_MAX")
	require.Contains(t, names, "API_ADDR")
	for _, a := range names {
		for _, b := range names {
			if a == b {
				continue
			}
			environ := []string{b + "=x"}
			require.Empty(t, read(environ, a).Misspelt(environ), "%s set beside a process that reads %s", b, a)
		}
	}
}
