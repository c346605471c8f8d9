package relayworker

import (
	"flag"
	"os"
	"regexp"
	"strconv"
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
	requireGenerated(t, "worker settings", settingsTable(settings))
}

// requireGenerated checks the block of docs/reference.md between
// "<!-- name: begin -->" and "<!-- name: end -->" is want, or writes it
// there with -update.
func requireGenerated(t *testing.T, name, want string) {
	t.Helper()
	const path = "../../docs/reference.md"
	begin, end := "<!-- "+name+": begin -->\n", "<!-- "+name+": end -->"
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(b)
	before, rest, ok := strings.Cut(doc, begin)
	require.True(t, ok, "%s lacks %q", path, begin)
	current, after, ok := strings.Cut(rest, end)
	require.True(t, ok, "%s lacks %q", path, end)
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

// The retention of failed messages and the time to live of idempotency keys
// are read from the environment; a TTL that is not positive is refused,
// naming its variable.
func TestRetentionSettingsAreParsed(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x",
		"OUTBOX_FAILED_RETENTION": "72h", "ORDERS_IDEMPOTENCY_TTL": "2h"}
	c, err := parseConfig(func(k string) string { return env[k] }, nil)
	require.NoError(t, err)
	require.Equal(t, 72*time.Hour, c.relay.FailedRetention)
	require.Equal(t, 2*time.Hour, c.idempotencyTTL)

	d := defaults()
	require.Equal(t, 30*24*time.Hour, d.relay.FailedRetention, "failed messages are kept for 30 days by default")
	require.Equal(t, 24*time.Hour, d.idempotencyTTL, "idempotency keys dedupe for a day by default")

	env = map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x", "OUTBOX_PARTITION_SPAN": "6h", "OUTBOX_PARTITIONS_AHEAD": "48h"}
	c, err = parseConfig(func(k string) string { return env[k] }, nil)
	require.NoError(t, err)
	require.Equal(t, 6*time.Hour, c.relay.PartitionSpan)
	require.Equal(t, 48*time.Hour, c.relay.PartitionsAhead)
	require.Equal(t, 48*time.Hour, d.relay.PartitionSpan, "a partition every two days by default")

	for name, v := range map[string]string{"ORDERS_IDEMPOTENCY_TTL": "0s", "OUTBOX_FAILED_RETENTION": "-1h",
		// A partition is named for its start to the minute.
		"OUTBOX_PARTITION_SPAN": "30s",
		// Within two prune intervals (an hour each), a prune job that
		// fails once would leave the writes no partition.
		"OUTBOX_PARTITIONS_AHEAD": "90m"} {
		env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x", name: v}
		_, err := parseConfig(func(k string) string { return env[k] }, nil)
		require.ErrorContains(t, err, name, "%s=%s is refused", name, v)
	}
}

// The prose of the docs names settings with their defaults in brackets, as
// a person writes them ("`OUTBOX_RELAY_TIMEOUT` (5 s)", "(default 7
// days)"): each such figure must be the table's default, so changing a
// default without the prose fails here.
func TestDocsStateTheDefaults(t *testing.T) {
	t.Parallel()
	d := defaults()
	byEnv := map[string]any{}
	for _, s := range allSettings() {
		byEnv[s.env] = s.bind(&d)
	}
	mention := regexp.MustCompile("`([A-Z_]+)` \\((?:default )?([0-9][^)]*)\\)")
	units := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "min": time.Minute, "minute": time.Minute,
		"minutes": time.Minute, "h": time.Hour, "hour": time.Hour, "hours": time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour}
	checked := 0
	for _, path := range []string{"../../README.md", "../../docs/design.md", "../../docs/operations.md", "../../docs/reference.md"} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range mention.FindAllStringSubmatch(string(b), -1) {
			p, ok := byEnv[m[1]]
			if !ok {
				continue
			}
			checked++
			// The figure, and its unit: "5 s", "24 h by default", "32".
			words := append(strings.Fields(strings.NewReplacer(",", " , ", ";", " ; ").Replace(m[2])), "")
			switch p := p.(type) {
			case *int:
				require.Equal(t, strconv.Itoa(*p), words[0], "%s: %s", path, m[0])
			case *time.Duration:
				n, unit := words[0], words[1]
				v, err := strconv.Atoi(n)
				require.NoError(t, err, "%s: %s", path, m[0])
				require.Contains(t, units, unit, "%s: %s", path, m[0])
				require.Equal(t, *p, time.Duration(v)*units[unit], "%s: %s", path, m[0])
			case *[]time.Duration:
				var want []string
				for _, w := range *p {
					want = append(want, formatDuration(w))
				}
				require.Equal(t, strings.Join(want, ","), strings.Fields(m[2])[0], "%s: %s", path, m[0])
			default:
				t.Errorf("%s: %s: a default of type %T in brackets", path, m[0], p)
			}
		}
	}
	require.Greater(t, checked, 15, "the docs' defaults were not found")

	// The hand-written tables (the settings both programs read) say the
	// worker's default too.
	row := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| (?:[a-z, ]+ \\| )?(`[^`]*`) \\|")
	b, err := os.ReadFile("../../docs/reference.md")
	require.NoError(t, err)
	both := 0
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		if p, ok := byEnv[m[1]]; ok {
			require.Equal(t, formatDefault(p), m[2], "docs/reference.md: %s", m[0])
			if strings.Contains(m[0], "| both |") {
				both++
			}
		}
	}
	require.GreaterOrEqual(t, both, 2, "the table of both programs' settings was not found")
}
