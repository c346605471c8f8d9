// Command scaffold makes the common changes to this template the same way
// every time. Run it from the repository root (the Taskfile does):
//
//	go run ./internal/scaffold service MODULE DIR   copy the template into DIR as module MODULE
//	go run ./internal/scaffold migration NAME       create the next goose migration in db/migrations
//	go run ./internal/scaffold event MODULE TYPE    add an event type to internal/MODULE
//
// or task new:service -- MODULE DIR, task new:migration -- NAME,
// task new:event -- MODULE TYPE. docs/adding-a-module.md shows them in use.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/format"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"

	"github.com/pressly/goose/v3"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "scaffold:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  scaffold service MODULE DIR   copy this template into DIR with module path MODULE
  scaffold migration NAME       create the next numbered migration in db/migrations
  scaffold event MODULE TYPE    add event TYPE (e.g. payment.captured) to internal/MODULE`

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch cmd, rest := args[0], args[1:]; {
	case cmd == "service" && len(rest) == 2:
		files, err := copyService(".", rest[1], rest[0])
		if err != nil {
			return err
		}
		fmt.Printf("copied %d files into %s as module %s\n\nnext:\n  cd %s\n  git init && git add -A\n  go build ./... && go tool -modfile=tools/go.mod task test\n",
			files, rest[1], rest[0], rest[1])
		return nil
	case cmd == "migration" && len(rest) == 1:
		path, err := newMigration("db/migrations", rest[0])
		if err != nil {
			return err
		}
		fmt.Println("created", path)
		return nil
	case cmd == "event" && len(rest) == 2:
		path, err := newEvent("internal", rest[0], rest[1])
		if err != nil {
			return err
		}
		fmt.Println("created", path)
		return nil
	}
	return errors.New(usage)
}

// modulePath reads the module path from dir/go.mod.
func modulePath(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("reading go.mod (run from the repository root): %w", err)
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(b)
	if m == nil {
		return "", errors.New("go.mod names no module")
	}
	return string(m[1]), nil
}

var validModule = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._~-]*(/[a-zA-Z0-9._~-]+)*$`)

// copyService copies the template at src into dst (which must not exist or
// be empty), renaming module path oldMod to newMod in every file that names
// it: go.mod, tools/go.mod, Go imports, and any other text file. It copies
// the files git knows (tracked, or untracked and not ignored); outside a
// git checkout, every file but .git and bin/.
func copyService(src, dst, newMod string) (int, error) {
	if !validModule.MatchString(newMod) || strings.Contains(newMod, "//") {
		return 0, fmt.Errorf("module path %q: want something like github.com/acme/payments", newMod)
	}
	oldMod, err := modulePath(src)
	if err != nil {
		return 0, err
	}
	if entries, err := os.ReadDir(dst); err == nil && len(entries) > 0 {
		return 0, fmt.Errorf("%s exists and is not empty", dst)
	}
	files, err := templateFiles(src)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, rel := range files {
		from := filepath.Join(src, rel)
		info, err := os.Lstat(from)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the working tree, or a symlink
		}
		b, err := os.ReadFile(from)
		if err != nil {
			return n, err
		}
		if !bytes.Contains(b, []byte{0}) {
			b = renameModule(b, oldMod, newMod)
			if strings.HasSuffix(rel, ".go") {
				// Renamed imports may sort differently; keep gofmt happy.
				if formatted, err := format.Source(b); err == nil {
					b = formatted
				}
			}
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return n, err
		}
		if err := os.WriteFile(to, b, info.Mode().Perm()); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func templateFiles(src string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = src
	if out, err := cmd.Output(); err == nil {
		var files []string
		seen := map[string]bool{}
		for f := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
			if f != "" && !seen[f] {
				seen[f] = true
				files = append(files, filepath.FromSlash(f))
			}
		}
		return files, nil
	}
	var files []string
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() && (d.Name() == ".git" || rel == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// renameModule replaces oldMod where it stands as a module path: followed
// by "/", a quote, a space or the end, never as the prefix of a longer name.
func renameModule(b []byte, oldMod, newMod string) []byte {
	var out bytes.Buffer
	old := []byte(oldMod)
	for {
		i := bytes.Index(b, old)
		if i < 0 {
			out.Write(b)
			return out.Bytes()
		}
		end := i + len(old)
		out.Write(b[:i])
		if end == len(b) || !isPathChar(rune(b[end])) {
			out.WriteString(newMod)
		} else {
			out.Write(old)
		}
		b = b[end:]
	}
}

func isPathChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("-._~", r)
}

var migrationName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// newMigration creates the next sequentially numbered goose migration.
// River's migrations (go generate ./db) are numbered in the same sequence.
func newMigration(dir, name string) (string, error) {
	if !migrationName.MatchString(name) {
		return "", fmt.Errorf("migration name %q: use lower_snake_case, e.g. add_payments", name)
	}
	before, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
	goose.SetSequential(true)
	if err := goose.CreateWithTemplate(nil, dir, migrationTemplate, name, "sql"); err != nil {
		return "", fmt.Errorf("creating migration: %w", err)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
	for _, f := range after {
		if !contains(before, f) {
			return f, nil
		}
	}
	return "", errors.New("goose created no file")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

var eventType = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`)

// newEvent adds an event type to a module: its name as a constant and its
// payload as a struct, in internal/MODULE/event_<type>.go.
func newEvent(internalDir, mod, typ string) (string, error) {
	if !eventType.MatchString(typ) {
		return "", fmt.Errorf("event type %q: use lower-case words joined by dots, e.g. payment.captured", typ)
	}
	dir := filepath.Join(internalDir, mod)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("module %s: %w", mod, err)
	}
	camel := ""
	for w := range strings.FieldsFuncSeq(typ, func(r rune) bool { return r == '.' || r == '_' }) {
		camel += strings.ToUpper(w[:1]) + w[1:]
	}
	path := filepath.Join(dir, "event_"+strings.NewReplacer(".", "_").Replace(typ)+".go")
	if _, err := os.Stat(path); err == nil {
		return "", fmt.Errorf("%s exists", path)
	}
	src := strings.NewReplacer("PKG", mod, "TYPE", typ, "NAME", camel).Replace(eventTemplate)
	b, err := format.Source([]byte(src))
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, b, 0o644)
}

const eventTemplate = `package PKG

// "TYPE": announce it from the transaction that makes it true, so the
// event and the change share one fate:
//
//	outbox.Enqueue(ctx, tx, outbox.Event{Type: EventNAME, Data: NAME{...}})
//
// Endpoints receive it when they subscribe to its type ("event_types").

// EventNAME is the event's type, as endpoints subscribe to it.
const EventNAME = "TYPE"

// NAME is the event's payload: a snapshot of what was true in the
// transaction that emitted it. Receivers deduplicate on the webhook-id, so
// the payload needs no id of its own to be idempotent. It is a contract:
// add fields, never change or remove them.
type NAME struct {
	// TODO: the fields receivers of "TYPE" need.
}
`

var migrationTemplate = mustTemplate()
