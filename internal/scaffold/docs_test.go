package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// productDocs reads README.md and docs/*.md, by their paths from the root.
func productDocs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	require.NoError(t, err)
	paths = append(paths, filepath.Join("..", "..", "README.md"))
	docs := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		rel, err := filepath.Rel(filepath.Join("..", ".."), p)
		require.NoError(t, err)
		docs[filepath.ToSlash(rel)] = string(b)
	}
	require.Contains(t, docs, "docs/reference.md")
	return docs
}

var (
	fenced     = regexp.MustCompile("(?ms)^\\s*```[^\\n]*\\n.*?^\\s*```")
	inlineCode = regexp.MustCompile("`[^`]+`")
	// bareTask is task run as a command: at the start, or after a space,
	// a backquote, a bracket or a shell operator (not ./task).
	bareTask = regexp.MustCompile("(?:^|[\\s(;&|`])task\\s+[-\\w:]")
)

// The docs run the tasks as ./task, the wrapper at the root that needs
// nothing installed: a bare task is a program the reader may not have
// (go tool -modfile=tools/go.mod task, which ./task runs, is allowed).
func TestDocsRunTasksThroughTheWrapper(t *testing.T) {
	t.Parallel()
	for path, doc := range productDocs(t) {
		code := fenced.FindAllString(doc, -1)
		code = append(code, inlineCode.FindAllString(fenced.ReplaceAllString(doc, ""), -1)...)
		for _, c := range code {
			c = strings.ReplaceAll(c, "go tool -modfile=tools/go.mod task", "./task")
			require.NotRegexp(t, bareTask, c, "%s runs a bare task: write ./task", path)
		}
	}
}

// The README is the front door: a short page, its detail in docs/.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	info, err := os.Stat(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	require.LessOrEqual(t, info.Size(), int64(8192), "README.md is at most 8 KB: move detail to docs/")
}
