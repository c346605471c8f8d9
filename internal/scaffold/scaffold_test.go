package main

import (
	"bytes"
	"fmt"
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

func TestAddToSQLCAppendsToTheModulesBlockOrCreatesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sqlc.yaml")
	initial := `version: "2"
sql:
  - name: outbox
    engine: postgresql
    schema:
      - db/migrations/00001_outbox.sql
    queries: db/queries/outbox
  - name: orders
    engine: postgresql
    schema: db/migrations/00002_orders.sql
    queries: db/queries/orders
`
	if err := os.WriteFile(path, []byte(initial), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ mod, file string }{
		{"outbox", "db/migrations/00003_more_outbox.sql"},
		{"orders", "db/migrations/00004_more_orders.sql"},
		{"payments", "db/migrations/00005_create_payments.sql"},
	} {
		if err := addToSQLC(path, step.mod, step.file); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(path)
	want := `version: "2"
sql:
  - name: outbox
    engine: postgresql
    schema:
      - db/migrations/00001_outbox.sql
      - db/migrations/00003_more_outbox.sql
    queries: db/queries/outbox
  - name: orders
    engine: postgresql
    schema:
      - db/migrations/00002_orders.sql
      - db/migrations/00004_more_orders.sql
    queries: db/queries/orders
  - name: payments
    engine: postgresql
    schema:
      - db/migrations/00005_create_payments.sql
    queries: db/queries/payments
    gen:
      go:
        <<: *go
        package: paymentsdb
        out: internal/payments/internal/paymentsdb
`
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// A module's events live in its events.go, as the orders module keeps
// them: each a constant, all in the Events list.
func TestNewEventFollowsTheOrdersModule(t *testing.T) {
	internal := t.TempDir()
	if err := os.Mkdir(filepath.Join(internal, "payments"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(internal, "payments", "events.go")
	for i, typ := range []string{"payment.captured", "payment.refunded", "refund.issued", "payment_method.updated"} {
		report, err := newEvent(internal, "payments", typ)
		if err != nil {
			t.Fatal(err)
		}
		// It says what it did: created the file for the first event,
		// added each later one to it.
		want := "added " + typ + " to " + path
		if i == 0 {
			want = "created " + path + " with " + typ
		}
		if !strings.HasPrefix(report, want) {
			t.Errorf("new:event %s reported %q, want %q", typ, report, want)
		}
		// The team documents each event; a bracket in a comment is no
		// end of the const block.
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.Replace(b, []byte("TODO: what happened. Payload: TODO."), []byte("it happened. Payload: the Payment (amounts in cents)."), 1)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// As orders names order.placed EventPlaced: the module's own entity
	// goes without saying, another's does not.
	for _, want := range []string{`EventCaptured = "payment.captured"`, `EventRefunded = "payment.refunded"`,
		`EventRefundIssued = "refund.issued"`, `EventPaymentMethodUpdated = "payment_method.updated"`,
		"var Events = []string{EventCaptured, EventRefunded, EventRefundIssued, EventPaymentMethodUpdated}"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("events.go lacks %q:\n%s", want, b)
		}
	}
	if _, err := newEvent(internal, "payments", "payment.captured"); err == nil {
		t.Error("the same event was added twice")
	}
	// What it cannot write, it names: the files to fill in, by the constant.
	for _, want := range []string{"EventCaptured's comment in internal/payments/events.go",
		"internal/payments/events/payment.captured.schema.json", "./task generate", "outbox.Event{Type: EventCaptured",
		"openapi/openapi.yaml", "docs/reference.md", "payments.Events"} {
		if list := eventChecklist("payments", "payment.captured"); !strings.Contains(list, want) {
			t.Errorf("the checklist new:event prints lacks %q:\n%s", want, list)
		}
	}
	// The orders module follows the same shape, so the scaffold can extend it.
	orders, err := os.ReadFile(filepath.Join("..", "orders", "events.go"))
	if err != nil || !strings.Contains(string(orders), "var Events = []string{") || !strings.Contains(string(orders), "const (") {
		t.Errorf("internal/orders/events.go no longer has the shape new:event writes (%v)", err)
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
	n, err := copyService(root, dst, newMod, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("copied %d files", n)
	if _, err := os.Stat(filepath.Join(dst, "lab")); !os.IsNotExist(err) {
		t.Fatalf("the lab was copied: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(dst, "README.md"))
	if err != nil || !bytes.HasPrefix(readme, []byte("# shop\n")) {
		t.Fatalf("the copy's README is not its own: %.80q (%v)", readme, err)
	}
	if !bytes.Contains(readme, []byte("which this copy leaves out")) {
		t.Errorf("the copy's README does not say where the lab its docs cite went:\n%s", readme)
	}
	if devdb, err := os.ReadFile(filepath.Join(dst, "internal", "devdb", "devdb.go")); err != nil || !bytes.Contains(devdb, []byte(`LocalDatabase = "shop"`)) {
		t.Fatalf("the copy's development database is not named after it (%v)", err)
	}
	if api, err := os.ReadFile(filepath.Join(dst, "internal", "apiserver", "apiserver.go")); err != nil || !bytes.Contains(api, []byte(`"shop-api"`)) {
		t.Fatalf("the copy's api does not name itself after the copy in its traces (%v)", err)
	}
	for _, script := range []string{"db-backup", "db-restore"} {
		if b, err := os.ReadFile(filepath.Join(dst, "scripts", script)); err != nil || !bytes.Contains(b, []byte("127.0.0.1:5432/shop?")) {
			t.Fatalf("the copy's scripts/%s does not default to its development database (%v)", script, err)
		}
	}

	// Nothing still names the old module path, nor keeps the lab's text.
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
		// What reaches another system or the database server (a webhook's
		// User-Agent, a test template's name, a directory) names the copy.
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") && !strings.Contains(path, "scaffold") &&
			bytes.Contains(bytes.ToLower(b), []byte(strings.ToLower(filepath.Base(filepath.Dir(oldMod))))) {
			t.Errorf("%s names the template's owner, %s", path, filepath.Base(filepath.Dir(oldMod)))
		}
		if !strings.Contains(path, "scaffold") && (bytes.Contains(b, []byte(labBegin)) || bytes.Contains(b, []byte("\n"+labBeginLine+"\n"))) {
			t.Errorf("%s keeps text marked as the lab's", path)
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
	// The copy's own tests, as its CI would run them (the copy of this test
	// skips under -short, so it does not copy the copy).
	sh("go test -short -count=1 ./...")
	// Its test task, the README's test command: every task it calls is
	// there, and every step that names the lab, run for real, passes
	// without it (the whole task runs the copy's suite again, at length).
	dry := sh("task --dry test")
	for _, line := range strings.Split(dry, "\n") {
		step, ok := strings.CutPrefix(line, "task: [test] ")
		if ok && strings.Contains(step, "./lab/") {
			t.Logf("run: %s", step)
			sh(step)
		}
	}

	// Follow docs/adding-a-module.md in the copy.
	doc, err := os.ReadFile(filepath.Join(root, "docs", "adding-a-module.md"))
	if err != nil {
		t.Fatal(err)
	}
	steps := docSteps(t, string(doc))
	if len(steps) < 8 {
		t.Fatalf("docs/adding-a-module.md: found only %d steps", len(steps))
	}
	// A migration's number, NNNNN in the page, is the one new:migration
	// gave the file the step names.
	migration := func(arg string) string {
		if !strings.Contains(arg, "NNNNN") {
			return arg
		}
		m, _ := filepath.Glob(filepath.Join(dst, filepath.FromSlash(strings.ReplaceAll(arg, "NNNNN", "[0-9][0-9][0-9][0-9][0-9]"))))
		if len(m) != 1 {
			t.Fatalf("%s: want one migration of that name, found %q", arg, m)
		}
		rel, _ := filepath.Rel(dst, m[0])
		return filepath.ToSlash(rel)
	}
	for _, s := range steps {
		body := string(renameModule([]byte(s.body), oldMod, newMod))
		target := filepath.Join(dst, filepath.FromSlash(migration(s.arg)))
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
		case "edit":
			b, err := os.ReadFile(target)
			if err != nil {
				t.Fatal(err)
			}
			out, err := applyEdit(string(b), body)
			if err != nil {
				t.Fatalf("docs/adding-a-module.md, the edit of %s: %v", s.arg, err)
			}
			if err := os.WriteFile(target, []byte(out), 0o644); err != nil {
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

var stepMarker = regexp.MustCompile("(?m)^<!-- (run|file|append|edit)(?:: (\\S+))? -->\n```[a-z]*\n")

// applyEdit applies an edit block, written as a diff hunk without its
// header: lines starting with "+" are added, "-" removed, " " kept. The kept
// and removed lines, in order, must appear exactly once in src, so an edit
// that no longer fits the file it edits fails instead of landing elsewhere.
func applyEdit(src, edit string) (string, error) {
	var before, after []string
	for _, line := range strings.Split(strings.TrimSuffix(edit, "\n"), "\n") {
		if line == "" {
			line = " "
		}
		switch text := line[1:]; line[0] {
		case ' ':
			before, after = append(before, text), append(after, text)
		case '-':
			before = append(before, text)
		case '+':
			after = append(after, text)
		default:
			return "", fmt.Errorf("line %q starts with neither +, - nor a space", line)
		}
	}
	old, new := strings.Join(before, "\n")+"\n", strings.Join(after, "\n")+"\n"
	if n := strings.Count(src, old); n != 1 {
		return "", fmt.Errorf("the lines it keeps and removes appear %d times, want once:\n%s", n, old)
	}
	return strings.Replace(src, old, new, 1), nil
}

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
