package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A copy made without the lab keeps none of the text marked as the lab's:
// in Markdown what stands between <!-- lab --> and <!-- /lab -->, inline or
// on lines of its own; in YAML and .gitignore the lines from "# lab" to
// "# /lab". Unmarked text is kept byte for byte.
func TestStripLabRemovesTheMarkedText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, file, in, want string }{
		{"inline", "docs/a.md",
			"costs throughput<!-- lab --> (lab/bench/PERFORMANCE.md,\nsection 1)<!-- /lab -->.\n",
			"costs throughput.\n"},
		{"lines", "README.md",
			"intro\n\n<!-- lab -->\n- [lab](lab/README.md): the lab\n<!-- /lab -->\n- [docs](docs/a.md)\n",
			"intro\n\n- [docs](docs/a.md)\n"},
		{"a paragraph between blank lines leaves one", "docs/a.md",
			"one\n\n<!-- lab -->\nthe lab's\n<!-- /lab -->\n\ntwo\n",
			"one\n\ntwo\n"},
		{"two blocks", "docs/a.md",
			"a<!-- lab -->x<!-- /lab -->b<!-- lab -->y<!-- /lab -->c\n",
			"abc\n"},
		{"yaml", "Taskfile.yml",
			"tasks:\n  # lab\n  bench:\n    cmds: [go run ./lab/bench]\n  # /lab\n  test:\n    cmds: [go test ./...]\n",
			"tasks:\n  test:\n    cmds: [go test ./...]\n"},
		{"a yaml block between blank lines leaves one", "Taskfile.yml",
			"vars:\n  X: 1\n\n# lab\nincludes:\n  lab: ./lab/Taskfile.yml\n# /lab\n\ntasks:\n",
			"vars:\n  X: 1\n\ntasks:\n"},
		{"gitignore", ".gitignore",
			"/bin/\n# lab\n/bench\n# /lab\n*.out\n",
			"/bin/\n*.out\n"},
		{"other files are not read for markers", "internal/x.go",
			"// <!-- lab -->kept<!-- /lab -->\n# lab\n",
			"// <!-- lab -->kept<!-- /lab -->\n# lab\n"},
	} {
		got, err := stripLab(c.file, []byte(c.in))
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, string(got), c.name)
	}
	for _, c := range []struct{ file, in string }{
		{"docs/a.md", "a<!-- lab -->b\n"},
		{"docs/a.md", "a<!-- /lab -->b\n"},
		{"docs/a.md", "<!-- lab -->a<!-- lab -->b<!-- /lab -->\n"},
		{"Taskfile.yml", "# lab\nx: 1\n"},
		{"Taskfile.yml", "x: 1\n# /lab\n"},
	} {
		_, err := stripLab(c.file, []byte(c.in))
		require.Error(t, err, "unbalanced markers in %s are refused: %q", c.file, c.in)
	}
}

// pathOf finds a path of part p in a line: into a directory of its, or to
// a file of its (a document also by its name alone, as docs link to each
// other); for the lab, the bench's report by name too.
func pathOf(p part) *regexp.Regexp {
	var alts []string
	for _, path := range p.paths {
		if dir, ok := strings.CutSuffix(path, "/"); ok {
			// internal/consumer, or the lab's lab/ (not the word lab).
			if strings.Contains(dir, "/") {
				alts = append(alts, `\b`+regexp.QuoteMeta(dir)+`\b`)
			} else {
				alts = append(alts, `\b`+regexp.QuoteMeta(path))
			}
			continue
		}
		alts = append(alts, regexp.QuoteMeta(path))
		if strings.HasSuffix(path, ".md") {
			alts = append(alts, `\b`+regexp.QuoteMeta(filepath.Base(path)))
		}
	}
	if p.name == "lab" {
		alts = append(alts, `PERFORMANCE\.md`)
	}
	return regexp.MustCompile(strings.Join(alts, "|"))
}

// mdLink finds a Markdown link's target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// The product's docs stand alone in a copy made without any part it may
// leave out (the lab, the brokers, the consumer): stripped as new:service
// strips them, README.md (the template's, and the copy's own) and
// docs/*.md link only to files the copy has, and name no path of the part
// left out; nor do the Taskfile, .gitignore, the CI scripts and the
// product's code.
func TestProductStandsAloneWithoutEachPart(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	files, err := templateFiles(root)
	require.NoError(t, err)
	for _, p := range parts {
		// Every part but the lab is left out with the lab.
		leave := []part{parts[0]}
		if p.name != "lab" {
			leave = append(leave, p)
		}
		owned := func(f string) bool { return slices.ContainsFunc(leave, func(p part) bool { return p.owns(f) }) }
		have := map[string]bool{}
		for _, f := range files {
			if !owned(f) {
				have[filepath.ToSlash(f)] = true
			}
		}
		type doc struct{ path, text string }
		docs := []doc{{"README.md", copyReadme("shop", leave)}}
		for f := range have {
			if strings.HasPrefix(f, "internal/scaffold/") || strings.HasSuffix(f, "go.sum") {
				continue // the scaffold names the parts it leaves behind
			}
			b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
			require.NoError(t, err)
			if strings.ContainsRune(string(b), 0) {
				continue
			}
			for _, l := range leave {
				b, err = stripPart(f, b, l.name)
				require.NoError(t, err, f)
			}
			docs = append(docs, doc{f, string(b)})
		}
		named := pathOf(p)
		for _, d := range docs {
			f, text := d.path, d.text
			for i, line := range strings.Split(text, "\n") {
				if f == "Taskfile.yml" && strings.Contains(line, "grep -v '/lab/'") {
					continue // the product's tests leave out the lab's packages, when there are any
				}
				if named.MatchString(line) {
					t.Errorf("%s:%d names the %s, which a copy without it lacks: mark it as the %s's "+
						"(<!-- %s -->, # %s or // %s), or reword it: %s", f, i+1, p.name, p.name, p.name, p.name, p.name, line)
				}
			}
			if !strings.HasSuffix(f, ".md") {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				resolved := filepath.ToSlash(filepath.Join(filepath.Dir(f), target))
				_, isFile := have[resolved]
				isDir := false
				for g := range have {
					if strings.HasPrefix(g, resolved+"/") {
						isDir = true
						break
					}
				}
				if !isFile && !isDir {
					t.Errorf("%s links to %s, which a copy without the %s lacks", f, m[1], p.name)
				}
			}
		}
	}
}

// new:service strips the lab's text from the files it copies without the
// lab, and keeps it, markers and all, with -with-lab.
func TestCopyServiceStripsTheLabsTextUnlessWithLab(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	files := map[string]string{
		"go.mod":       "module github.com/x/orders\n\ngo 1.26\n",
		"README.md":    "# orders\n",
		"docs/a.md":    "fast<!-- lab --> (lab/bench/PERFORMANCE.md)<!-- /lab -->.\n",
		"Taskfile.yml": "version: \"3\"\n# lab\nincludes:\n  lab: ./lab/Taskfile.yml\n# /lab\n",
		".gitignore":   "/bin/\n# lab\n/bench\n# /lab\n",
		"lab/x.go":     "package lab\n",
	}
	for f, text := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(src, filepath.Dir(f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(src, f), []byte(text), 0o644))
	}
	read := func(dir, f string) string {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		return string(b)
	}

	without := filepath.Join(t.TempDir(), "shop")
	_, err := copyService(src, without, "example.com/shop", false)
	require.NoError(t, err)
	require.Equal(t, "fast.\n", read(without, "docs/a.md"))
	require.Equal(t, "version: \"3\"\n", read(without, "Taskfile.yml"))
	require.Equal(t, "/bin/\n", read(without, ".gitignore"))
	require.NoDirExists(t, filepath.Join(without, "lab"))

	with := filepath.Join(t.TempDir(), "shop")
	_, err = copyService(src, with, "example.com/shop", true)
	require.NoError(t, err)
	for _, f := range []string{"docs/a.md", "Taskfile.yml", ".gitignore"} {
		require.Equal(t, files[f], read(with, f), "-with-lab keeps %s as it is", f)
	}
	require.FileExists(t, filepath.Join(with, "lab", "x.go"))
}

// A copy names itself after its module path, not after the template: its
// processes in traces and logs (OTEL_SERVICE_NAME's defaults) and the
// CloudEvents source of its broker events.
func TestCopyServiceNamesItself(t *testing.T) {
	t.Parallel()
	require.Equal(t, [][2]string{
		{"orders-api", "payments-api"},
		{"orders-worker", "payments-worker"},
		{"urn:outboxkit:orders", "urn:acme:payments"},
	}, serviceNames("github.com/outboxkit/orders", "github.com/acme/payments"))
	require.Equal(t, [][2]string{
		{"orders-api", "shop-api"},
		{"orders-worker", "shop-worker"},
		{"urn:outboxkit:orders", "urn:shop"},
	}, serviceNames("github.com/outboxkit/orders", "Shop"))

	src := t.TempDir()
	files := map[string]string{
		"go.mod":            "module github.com/outboxkit/orders\n\ngo 1.26\n",
		"internal/api.go":   "package internal\n\nvar name, test = \"orders-api\", \"orders-api-test\"\n",
		"docs/reference.md": "| `OTEL_SERVICE_NAME` | `orders-api` / `orders-worker` |\n| `OUTBOX_EVENT_SOURCE` | `urn:outboxkit:orders` |\n",
	}
	for f, text := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(src, filepath.Dir(f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(src, f), []byte(text), 0o644))
	}
	dst := filepath.Join(t.TempDir(), "payments")
	_, err := copyService(src, dst, "github.com/acme/payments", false)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dst, "internal", "api.go"))
	require.NoError(t, err)
	require.Equal(t, "package internal\n\nvar name, test = \"payments-api\", \"payments-api-test\"\n", string(b))
	b, err = os.ReadFile(filepath.Join(dst, "docs", "reference.md"))
	require.NoError(t, err)
	require.Equal(t, "| `OTEL_SERVICE_NAME` | `payments-api` / `payments-worker` |\n| `OUTBOX_EVENT_SOURCE` | `urn:acme:payments` |\n", string(b))

	// The names are where the product's code has them: a renamed default
	// would leave the copy with the template's name.
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	oldMod, err := modulePath(root)
	require.NoError(t, err)
	for _, c := range []struct{ file, name string }{
		{"internal/apiserver/apiserver.go", `"orders-api"`},
		{"internal/relayworker/relayworker.go", `"orders-worker"`},
		{"internal/relayworker/brokers.go", `"urn:outboxkit:orders"`},
	} {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(c.file)))
		if os.IsNotExist(err) {
			continue // left out with a part of the template
		}
		require.NoError(t, err)
		require.Contains(t, string(b), c.name, "%s names the service as new:service renames it", c.file)
		found := false
		for _, n := range serviceNames(oldMod, "example.com/x") {
			found = found || `"`+n[0]+`"` == c.name
		}
		require.True(t, found, "new:service renames %s", c.name)
	}
}
