package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A part's text is marked in each kind of file as a reader of that kind
// expects: an HTML comment in Markdown, a comment line in YAML and the CI
// scripts, a comment line in Go. Stripping one part leaves another's.
func TestStripPartRemovesItsMarkedText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, file, in, want string }{
		{"go", "internal/relayworker/x.go",
			"package x\n\nimport (\n\t\"fmt\"\n\n\t// brokers\n\t\"example.com/broker\"\n\t// /brokers\n)\n\nvar a = 1\n\n// brokers\nvar b = broker.X\n\n// /brokers\n",
			"package x\n\nimport (\n\t\"fmt\"\n\n)\n\nvar a = 1\n\n"},
		{"a ci script", ".ci/run", "set -e\n# brokers\nbash .ci/ensure-brokers\n# /brokers\ngo test\n", "set -e\ngo test\n"},
		{"a table row", "README.md", "| a |<!-- brokers -->\n| broker |<!-- /brokers -->\n| b |\n", "| a |\n| b |\n"},
		{"another part's text stays", "docs/a.md", "x<!-- consumer --> y<!-- /consumer -->\n", "x<!-- consumer --> y<!-- /consumer -->\n"},
		{"a Go comment that only starts with the name stays", "x.go", "// brokers are servers\nvar c int\n", "// brokers are servers\nvar c int\n"},
	} {
		got, err := stripPart(c.file, []byte(c.in), "brokers")
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, string(got), c.name)
	}
	_, err := stripPart("x.go", []byte("// brokers\nvar b int\n"), "brokers")
	require.Error(t, err, "a Go marker left open is refused")
}

// -without leaves out a part's files and marked text, says so in the
// copy's README, and refuses what it does not know, or a lab without the
// part it uses.
func TestCopyWithoutAPartLeavesItOut(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	files := map[string]string{
		"go.mod":                          "module github.com/x/orders\n\ngo 1.26\n",
		"README.md":                       "# orders\n",
		"docs/brokers.md":                 "# brokers\n",
		"docs/a.md":                       "webhooks<!-- brokers -->, or a broker ([brokers](brokers.md))<!-- /brokers -->.\n",
		"internal/broker/broker.go":       "package broker\n",
		"internal/consumer/consumer.go":   "package consumer\n",
		"internal/relayworker/worker.go":  "package relayworker\n\nvar kinds = []string{\"webhook\",\n\t// brokers\n\t\"nats\",\n\t// /brokers\n}\n",
		"internal/relayworker/brokers.go": "package relayworker\n",
	}
	for f, text := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(src, filepath.Dir(f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(src, f), []byte(text), 0o644))
	}
	dst := filepath.Join(t.TempDir(), "shop")
	_, err := copyService(src, dst, "example.com/shop", false, "brokers")
	require.NoError(t, err)
	for _, f := range []string{"docs/brokers.md", "internal/broker/broker.go", "internal/relayworker/brokers.go"} {
		require.NoFileExists(t, filepath.Join(dst, f), "the brokers' own file %s is left out", f)
	}
	require.FileExists(t, filepath.Join(dst, "internal/consumer/consumer.go"), "the consumer is kept")
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(dst, f))
		require.NoError(t, err)
		return string(b)
	}
	require.Equal(t, "webhooks.\n", read("docs/a.md"))
	require.Equal(t, "package relayworker\n\nvar kinds = []string{\"webhook\"}\n", read("internal/relayworker/worker.go"))
	require.Contains(t, read("README.md"), "without broker destinations", "the README says what the copy left out")
	require.NotContains(t, read("README.md"), "without the reference consumer")

	for _, without := range [][]string{{"lab"}, {"kafka"}} {
		_, err := copyService(src, filepath.Join(t.TempDir(), "shop"), "example.com/shop", false, without...)
		require.ErrorContains(t, err, "may leave out brokers and consumer", "-without %s", without)
	}
	_, err = copyService(src, filepath.Join(t.TempDir(), "shop"), "example.com/shop", true, "consumer")
	require.ErrorContains(t, err, "the lab (-with-lab) uses every part", "the lab needs the consumer")
}

// A copy made without the brokers, without the consumer, or without both
// builds and vets (its tests included), has none of the libraries of what
// it left out, and passes its own tests; each one's size is logged (lines
// of Go outside tests), as docs/adding-a-module.md states them.
func TestCopyWithoutPartsBuildsAndPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("copies and builds the template three times")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	size := func(dir string) int {
		lines := 0
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			lines += strings.Count(string(b), "\n")
			return err
		})
		require.NoError(t, err)
		return lines
	}
	full := filepath.Join(t.TempDir(), "shop")
	_, err = copyService(root, full, "example.com/acme/shop", false)
	require.NoError(t, err)
	t.Logf("the copy with every part: %d lines of Go outside tests", size(full))
	for _, c := range []struct {
		without []string
		// run: the copy's whole suite, or its tests only built (vet).
		run  bool
		gone []string // modules go.mod no longer requires
	}{
		{[]string{"brokers"}, false, []string{"github.com/nats-io/nats.go", "github.com/twmb/franz-go", "github.com/rabbitmq/amqp091-go"}},
		{[]string{"consumer"}, false, nil},
		{[]string{"brokers", "consumer"}, true, []string{"github.com/nats-io/nats.go", "github.com/twmb/franz-go", "github.com/rabbitmq/amqp091-go"}},
	} {
		dst := filepath.Join(t.TempDir(), "shop")
		_, err := copyService(root, dst, "example.com/acme/shop", false, c.without...)
		require.NoError(t, err, "-without %s", c.without)
		t.Logf("the copy without %s: %d lines of Go outside tests", strings.Join(c.without, " and "), size(dst))
		gomod, err := os.ReadFile(filepath.Join(dst, "go.mod"))
		require.NoError(t, err)
		for _, mod := range c.gone {
			require.NotContains(t, string(gomod), mod+" ", "without %s, go.mod does not require %s", c.without, mod)
		}
		sh := func(script string) {
			t.Helper()
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
			cmd.Dir = dst
			cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "without %s, in the copy: %s\n%s", c.without, script, out)
		}
		sh("go build ./... && go vet ./... && go mod tidy -diff && go tool -modfile=tools/go.mod sqlc diff")
		if c.run {
			sh("go test -short -count=1 ./...")
		} else {
			// What a part's text stands in: the docs, the settings tables.
			sh("go test -short -count=1 ./internal/scaffold/ ./internal/relayworker/ ./cmd/...")
		}
	}
}
