package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// AlertRules reads the Prometheus rules of docs/operations.md that follow
// the line intro (a ```yaml block), checks them with tools/promrules
// (Prometheus's own rule parser, kept out of the service's module) and
// returns the metrics they name, each with the rules naming it.
func AlertRules(t *testing.T, intro string) map[string][]string {
	t.Helper()
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)" + regexp.QuoteMeta(intro) + "\n\n```yaml\n(.*?)```").FindSubmatch(doc)
	require.NotNil(t, m, "operations.md has rules after %q", intro)
	out, err := Promrules(root, string(m[1]))
	require.NoError(t, err, "the rules parse as Prometheus reads them")
	named := map[string][]string{}
	for line := range strings.Lines(out) {
		metric, rule, ok := strings.Cut(strings.TrimSpace(line), "\t")
		require.True(t, ok, "promrules printed %q", line)
		named[metric] = append(named[metric], rule)
	}
	return named
}

// Promrules runs tools/promrules of the module at root on rules and
// returns what it printed: "metric<TAB>rule" lines, or an error saying
// why Prometheus would refuse them.
func Promrules(root, rules string) (string, error) {
	cmd := exec.Command("go", "run", "./promrules")
	cmd.Dir = filepath.Join(root, "tools")
	cmd.Stdin = strings.NewReader(rules)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, stderr.String())
	}
	return string(out), nil
}

// moduleRoot is the directory of the module's go.mod, two levels above
// this file.
func moduleRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
