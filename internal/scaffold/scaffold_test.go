package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestRenameModule(t *testing.T) {
	in := "module github.com/x/orders\nimport \"github.com/x/orders/internal\"\n// github.com/x/orders-extra and github.com/x/ordersdb stay\ngithub.com/x/orders"
	want := "module example.com/shop\nimport \"example.com/shop/internal\"\n// github.com/x/orders-extra and github.com/x/ordersdb stay\nexample.com/shop"
	if got := string(renameModule([]byte(in), "github.com/x/orders", "example.com/shop")); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestNewMigrationIsNumberedNext(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"00001_a.sql", "00002_river_v001_x.sql"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("-- +goose Up\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path, err := newMigration(dir, "add_payments")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "00003_add_payments.sql" {
		t.Fatalf("got %s", path)
	}
	if _, err := newMigration(dir, "Bad Name"); err == nil {
		t.Fatal("a bad name was accepted")
	}
}

// The template copies into a new module that builds, vets and passes its
// unit tests; then docs/adding-a-module.md is followed, step by step, in
// that copy, and the result builds, vets and passes its tests, with the
// import rules intact.
func TestCopyAndAddAModule(t *testing.T) {
	if testing.Short() {
		t.Skip("copies and builds the whole template")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	oldMod, err := modulePath(root)
	if err != nil {
		t.Fatal(err)
	}
	const newMod = "example.com/acme/shop"
	dst := filepath.Join(t.TempDir(), "shop")
	n, err := copyService(root, dst, newMod)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("copied %d files", n)

	// Nothing still names the old module path.
	err = filepath.WalkDir(dst, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !bytes.Equal(renameModule(b, oldMod, "X"), b) {
			t.Errorf("%s still names %s", path, oldMod)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	sh := func(script string) string {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", "task() { go tool -modfile=tools/go.mod task \"$@\"; }\n"+script)
		cmd.Dir = dst
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("in the copy: %s\n%v\n%s", script, err, out)
		}
		return string(out)
	}
	sh("go build ./... && go vet ./...")
	sh("go test -count=1 ./internal/webhook/... ./internal/netguard/... ./internal/archtest/...")

	// Follow docs/adding-a-module.md in the copy.
	doc, err := os.ReadFile(filepath.Join(root, "docs", "adding-a-module.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps := docSteps(t, string(doc))
	if len(steps) < 8 {
		t.Fatalf("docs/adding-a-module.md: found only %d steps", len(steps))
	}
	number := func() string {
		m, _ := filepath.Glob(filepath.Join(dst, "db", "migrations", "*_payments.sql"))
		if len(m) != 1 {
			return "NNNNN"
		}
		return strings.SplitN(filepath.Base(m[0]), "_", 2)[0]
	}
	for _, s := range steps {
		body := string(renameModule([]byte(strings.ReplaceAll(s.body, "NNNNN", number())), oldMod, newMod))
		target := filepath.Join(dst, filepath.FromSlash(strings.ReplaceAll(s.arg, "NNNNN", number())))
		switch s.kind {
		case "run":
			t.Logf("run: %s", strings.TrimSpace(body))
			sh(body)
		case "file":
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(target, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		case "append":
			f, err := os.OpenFile(target, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteString(body)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "internal/payments/internal/paymentsdb/payments.sql.go")); err != nil {
		t.Fatalf("sqlc did not generate the payments package: %v", err)
	}
	sh("go tool -modfile=tools/go.mod sqlc diff")

	// The import rules catch a module importing another.
	bad := filepath.Join(dst, "internal/payments/bad.go")
	if err := os.WriteFile(bad, []byte("package payments\n\nimport _ \""+newMod+"/internal/orders\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "test", "-count=1", "./internal/archtest/")
	cmd.Dir = dst
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "module payments may import the outbox module only") {
		t.Fatalf("the import rules let payments import orders:\n%s", out)
	}
}

type step struct{ kind, arg, body string }

var stepMarker = regexp.MustCompile("(?m)^<!-- (run|file|append)(?:: (\\S+))? -->\n```[a-z]*\n")

// docSteps reads the marked blocks of a document, in order.
func docSteps(t *testing.T, doc string) []step {
	var steps []step
	for _, m := range stepMarker.FindAllStringSubmatchIndex(doc, -1) {
		rest := doc[m[1]:]
		end := strings.Index(rest, "```")
		if end < 0 {
			t.Fatalf("unterminated block at offset %d", m[1])
		}
		s := step{kind: doc[m[2]:m[3]], body: rest[:end]}
		if m[4] >= 0 {
			s.arg = doc[m[4]:m[5]]
		}
		steps = append(steps, s)
	}
	return steps
}
