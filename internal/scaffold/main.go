// Command scaffold makes the common changes to this template the same way
// every time. Run it from the repository root (the Taskfile does):
//
//	go run ./internal/scaffold service [-with-lab] [-without PARTS] MODULE DIR
//	                                       copy the template into DIR as module MODULE
//	go run ./internal/scaffold migration MODULE NAME           create the next goose migration for a module
//	go run ./internal/scaffold event MODULE TYPE               add an event type to internal/MODULE
//
// or ./task new:service -- MODULE DIR, ./task new:migration -- MODULE NAME,
// ./task new:event -- MODULE TYPE. docs/adding-a-module.md shows them in use.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pressly/goose/v3"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "scaffold:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  scaffold service [-with-lab] [-without PARTS] MODULE DIR
                                            copy this template into DIR with module path MODULE
                                            (the lab, lab/, only with -with-lab), leaving out
                                            PARTS, comma-separated: brokers, consumer
  scaffold migration MODULE NAME            create the next numbered migration in db/migrations
                                            and add it to MODULE's block in sqlc.yaml
  scaffold event MODULE TYPE                add event TYPE (e.g. payment.captured) to internal/MODULE`

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch cmd, rest := args[0], args[1:]; {
	case cmd == "service":
		fs := flag.NewFlagSet("service", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		withLab := fs.Bool("with-lab", false, "")
		without := fs.String("without", "", "")
		if err := fs.Parse(rest); err != nil || fs.NArg() != 2 {
			return errors.New(usage)
		}
		var leave []string
		for p := range strings.SplitSeq(*without, ",") {
			if p = strings.TrimSpace(p); p != "" {
				leave = append(leave, p)
			}
		}
		mod, dir := fs.Arg(0), fs.Arg(1)
		files, err := copyService(".", dir, mod, *withLab, leave...)
		if err != nil {
			return err
		}
		fmt.Printf("copied %d files into %s as module %s\n\nnext:\n  cd %s\n  git init && git add -A\n  go build ./... && ./task test\n",
			files, dir, mod, dir)
		return nil
	case cmd == "migration" && len(rest) == 2:
		path, err := newMigration("db/migrations", rest[1])
		if err != nil {
			return err
		}
		if err := addToSQLC("sqlc.yaml", rest[0], path); err != nil {
			return err
		}
		fmt.Printf("created %s and added it to the %s block of sqlc.yaml\n", path, rest[0])
		return nil
	case cmd == "event" && len(rest) == 2:
		report, err := newEvent("internal", rest[0], rest[1])
		if err != nil {
			return err
		}
		fmt.Println(report)
		report, err = addToCatalog(".", rest[0], rest[1])
		if err != nil {
			return err
		}
		fmt.Println(report)
		fmt.Print(eventChecklist(rest[0], rest[1]))
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
// git checkout, every file but .git and bin/. The lab (lab/: the bench,
// the workshop, the crash suite) stays behind unless withLab, and so do
// the parts named in without (brokers, consumer): their files, and the text
// the product's files mark as theirs (stripPart), after which go mod tidy
// drops the libraries only they used. The copy gets a README of its own,
// saying what it left out; its development database is named after it,
// and so are its processes and its events' source (serviceNames).
func copyService(src, dst, newMod string, withLab bool, without ...string) (int, error) {
	if !validModule.MatchString(newMod) || strings.Contains(newMod, "//") {
		return 0, fmt.Errorf("module path %q: want something like github.com/acme/payments", newMod)
	}
	var leave []part
	if !withLab {
		leave = append(leave, parts[0])
	}
	for _, name := range without {
		i := slices.IndexFunc(parts, func(p part) bool { return p.name == name })
		if i <= 0 {
			return 0, fmt.Errorf("-without %s: a copy may leave out %s", name, strings.Join(partNames(), " and "))
		}
		if withLab {
			return 0, fmt.Errorf("-without %s: the lab (-with-lab) uses every part of the template", name)
		}
		if !slices.ContainsFunc(leave, func(p part) bool { return p.name == name }) {
			leave = append(leave, parts[i])
		}
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
	name := serviceName(newMod)
	names := serviceNames(oldMod, newMod)
	n := 0
	for _, rel := range files {
		if slices.ContainsFunc(leave, func(p part) bool { return p.owns(rel) }) {
			continue
		}
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
			for _, n := range names {
				b = renameName(b, n[0], n[1])
			}
			for _, p := range leave {
				if b, err = stripPart(rel, b, p.name); err != nil {
					return n, err
				}
			}
			switch filepath.ToSlash(rel) {
			case "README.md":
				b = []byte(copyReadme(name, leave))
			case "internal/devdb/devdb.go":
				b = localDatabase.ReplaceAll(b, []byte(`${1}"`+name+`"`))
			case "scripts/db-backup", "scripts/db-restore":
				// Their default is the development database, renamed above.
				b = scriptDatabase.ReplaceAll(b, []byte(`${1}`+name+`?`))
			}
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
	if len(without) > 0 {
		// The libraries only the parts left out used go from go.mod.
		cmd := exec.Command("go", "mod", "tidy")
		cmd.Dir = dst
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			return n, fmt.Errorf("go mod tidy in %s: %w\n%s", dst, err, out)
		}
	}
	return n, nil
}

// part is what a service made from the template may leave out: the files
// and directories wholly its own, and the text the product's files mark as
// its own (stripPart).
type part struct {
	name string
	// paths are its files, and its directories ending in "/".
	paths []string
	// leftOut is what the README of a copy without it says.
	leftOut string
}

// owns reports whether rel, a path relative to the template's root, is
// wholly the part's.
func (p part) owns(rel string) bool {
	rel = filepath.ToSlash(rel)
	return slices.ContainsFunc(p.paths, func(path string) bool {
		return rel == path || strings.HasSuffix(path, "/") && strings.HasPrefix(rel, path)
	})
}

// parts are what a copy may leave out: the lab (unless -with-lab), then
// what -without names.
var parts = []part{
	{name: "lab", paths: []string{"lab/"}, leftOut: labLeftBehind},
	{name: "brokers", paths: []string{
		"internal/broker/", "internal/brokertest/", "docs/brokers.md", ".ci/ensure-brokers",
		"internal/relayworker/brokers.go", "internal/relayworker/brokers_test.go", "internal/relayworker/brokers_internal_test.go",
		"internal/outbox/secrets_broker_test.go",
		"internal/consumer/nats.go", "internal/consumer/nats_test.go", "internal/consumer/nats_export_test.go", "cmd/consumer/nats.go",
	}, leftOut: brokersLeftOut},
	{name: "consumer", paths: []string{"internal/consumer/", "cmd/consumer/"}, leftOut: consumerLeftOut},
}

// partNames are the parts -without takes.
func partNames() []string {
	var names []string
	for _, p := range parts[1:] {
		names = append(names, p.name)
	}
	return names
}

// serviceName is the last element of a module path, as a database name.
func serviceName(mod string) string {
	name := strings.ToLower(path.Base(mod))
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		name = "service_" + name
	}
	return name
}

// serviceNames pairs each name the template gives itself with the copy's:
// its processes' default OTEL_SERVICE_NAME (orders-api, orders-worker)
// and the default CloudEvents source of its broker events
// (urn:outboxkit:orders), each derived from the module path.
func serviceNames(oldMod, newMod string) [][2]string {
	return [][2]string{
		{slug(path.Base(oldMod)) + "-api", slug(path.Base(newMod)) + "-api"},
		{slug(path.Base(oldMod)) + "-worker", slug(path.Base(newMod)) + "-worker"},
		{eventSource(oldMod), eventSource(newMod)},
	}
}

// slug is s in lower case, each run of other characters than letters and
// digits a hyphen.
func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "-") {
			b.WriteByte('-')
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

// eventSource is a module's URN: its path without the host, in slugs
// joined by colons (github.com/acme/payments is urn:acme:payments).
func eventSource(mod string) string {
	elems := strings.Split(mod, "/")
	if len(elems) > 1 && strings.Contains(elems[0], ".") {
		elems = elems[1:]
	}
	for i, e := range elems {
		elems[i] = slug(e)
	}
	return "urn:" + strings.Join(elems, ":")
}

// renameName replaces old where it starts a name (not preceded by a
// letter, digit, hyphen or underscore).
func renameName(b []byte, old, new string) []byte {
	var out bytes.Buffer
	for {
		i := bytes.Index(b, []byte(old))
		if i < 0 {
			out.Write(b)
			return out.Bytes()
		}
		out.Write(b[:i])
		if r, _ := utf8.DecodeLastRune(b[:i]); i > 0 && (isPathChar(r) || r == '_') && r != '.' && r != '~' {
			out.WriteString(old)
		} else {
			out.WriteString(new)
		}
		b = b[i+len(old):]
	}
}

// localDatabase finds the development database's name in internal/devdb.
var localDatabase = regexp.MustCompile(`(LocalDatabase\s*=\s*)"[^"]*"`)

// scriptDatabase finds the development database's name in the default
// DATABASE_URL of the backup and restore scripts.
var scriptDatabase = regexp.MustCompile(`(127\.0\.0\.1:5432/)[a-z0-9_]+\?`)

// copyReadme is the README of a copy named name, which left out parts.
func copyReadme(name string, leftOut []part) string {
	readme := strings.ReplaceAll(readmeTemplate, "NAME", name)
	for _, p := range leftOut {
		readme += p.leftOut
	}
	return readme
}

// A part's text in the product's files, which a copy made without the
// part leaves out: in Markdown, whatever stands between "<!-- name -->" and
// "<!-- /name -->", inline or on lines of their own; in YAML, .gitignore
// and the shell scripts of .ci/, the lines from "# name" to "# /name"; in
// Go, the lines from "// name" to "// /name" (never inside a doc comment,
// which go doc would show them in: what a file documents for a part goes
// in a file of the part's own, such as cmd/consumer/nats.go's package
// comment). A copy that keeps the part keeps the text and its markers.
const (
	labBegin, labEnd = "<!-- lab -->", "<!-- /lab -->"
	labBeginLine     = "# lab"
)

// stripLab removes the text marked as the lab's from the file rel.
func stripLab(rel string, b []byte) ([]byte, error) { return stripPart(rel, b, "lab") }

// stripPart removes the text marked as part name's from the file rel (a
// path relative to the template's root), refusing markers that do not pair
// up. Files of other kinds are returned as they are.
func stripPart(rel string, b []byte, name string) ([]byte, error) {
	base := filepath.Base(rel)
	switch ext := filepath.Ext(base); {
	case ext == ".md":
		return stripMarkdown(rel, string(b), "<!-- "+name+" -->", "<!-- /"+name+" -->")
	case ext == ".yml" || ext == ".yaml" || base == ".gitignore" || path.Dir(filepath.ToSlash(rel)) == ".ci":
		return stripLines(rel, string(b), "# "+name, "# /"+name)
	case ext == ".go":
		return stripLines(rel, string(b), "// "+name, "// /"+name)
	}
	return b, nil
}

func stripMarkdown(rel, s, begin, end string) ([]byte, error) {
	var out strings.Builder
	for {
		i := strings.Index(s, begin)
		j := strings.Index(s, end)
		if i < 0 && j < 0 {
			out.WriteString(s)
			return []byte(out.String()), nil
		}
		if i < 0 || j < i {
			return nil, fmt.Errorf("%s: %s without a %s before it", rel, end, begin)
		}
		if j < 0 {
			return nil, fmt.Errorf("%s: %s without a %s after it", rel, begin, end)
		}
		if k := strings.Index(s[i+len(begin):j], begin); k >= 0 {
			return nil, fmt.Errorf("%s: %s inside another", rel, begin)
		}
		before, after := s[:i], s[j+len(end):]
		// A block on lines of its own goes with its lines, and with one
		// of the blank lines that set it apart.
		if (before == "" || strings.HasSuffix(before, "\n")) && strings.HasPrefix(after, "\n") {
			after = after[1:]
			if (before == "" || strings.HasSuffix(before, "\n\n")) && strings.HasPrefix(after, "\n") {
				after = after[1:]
			}
		}
		if after == "" && strings.HasSuffix(before, "\n\n") {
			before = strings.TrimRight(before, "\n") + "\n" // the file ends where the block did
		}
		out.WriteString(before)
		s = after
	}
}

func stripLines(rel, s, begin, end string) ([]byte, error) {
	var out []string
	in, ended := false, false
	for n, line := range strings.SplitAfter(s, "\n") {
		switch strings.TrimSpace(line) {
		case begin:
			if in {
				return nil, fmt.Errorf("%s:%d: %q inside another", rel, n+1, begin)
			}
			in = true
			continue
		case end:
			if !in {
				return nil, fmt.Errorf("%s:%d: %q without a %q before it", rel, n+1, end, begin)
			}
			in, ended = false, true
			continue
		}
		if in {
			continue
		}
		// A block set apart by blank lines leaves one of them.
		blank := strings.TrimSpace(line) == ""
		if ended && blank && (len(out) == 0 || strings.TrimSpace(out[len(out)-1]) == "") {
			ended = false
			continue
		}
		ended = false
		out = append(out, line)
	}
	if in {
		return nil, fmt.Errorf("%s: %q without a %q after it", rel, begin, end)
	}
	return []byte(strings.Join(out, "")), nil
}

// readmeTemplate is a copied service's README until its team writes one.
const readmeTemplate = `# NAME

A service made from the outboxkit/orders template: its modules write their
events to an outbox in the same transaction as their data, and a relay
(cmd/worker) delivers them as signed webhooks, at least once.

` + "```sh" + `
go run ./cmd/dev   # run it: api + worker + a demo receiver, on a local database named NAME
./task test        # test it, against a real PostgreSQL (after git init && git add -A)
` + "```" + `

docs/ explains the design (design.md), the configuration and API
(reference.md), operating it (operations.md) and adding a module
(adding-a-module.md).
`

// labLeftBehind ends the README of a copy made without the lab, whose
// docs state the lab's figures without naming it.
const labLeftBehind = `
The template's lab, which this copy leaves out (the performance suite, the
crash suite, the workshop), measured the figures the docs state and put the
product through its crashes; to keep it, copy the template with
` + "`-with-lab`" + `.
`

// brokersLeftOut ends the README of a copy made without broker destinations.
const brokersLeftOut = `
This copy was made without broker destinations (` + "`-without brokers`" + `): its
worker delivers webhooks only. It has no NATS JetStream, Kafka or RabbitMQ
transports, no broker settings and none of their client libraries, and its
reference consumer, if it kept one, reads no JetStream stream. The admin API
still knows the broker kinds: an endpoint of one fails and backs off, as on
a worker with no broker configured.
`

// consumerLeftOut ends the README of a copy made without the reference
// consumer.
const consumerLeftOut = `
This copy was made without the reference consumer (` + "`-without consumer`" + `):
the receiver, written to be copied into a service that receives these
webhooks, with its command, its schema and its block of sqlc.yaml. Its
receivers must deduplicate on the webhook-id all the same.
`

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

// eventConstant names an event type's constant as the orders module does:
// the module's own entity goes without saying (order.placed in orders is
// EventPlaced), another's is kept (refund.issued in payments is
// EventRefundIssued).
func eventConstant(mod, typ string) string {
	if entity, rest, ok := strings.Cut(typ, "."); ok && (entity == mod || entity+"s" == mod) {
		typ = rest
	}
	name := "Event"
	for w := range strings.FieldsFuncSeq(typ, func(r rune) bool { return r == '.' || r == '_' }) {
		name += strings.ToUpper(w[:1]) + w[1:]
	}
	return name
}

// newEvent adds an event type to a module, as the orders module keeps its
// own: a constant in the module's events.go and an entry in its Events list
// (creating the file for the module's first event). It reports what it did:
// "created FILE with TYPE (CONSTANT)" or "added TYPE to FILE (CONSTANT)".
func newEvent(internalDir, mod, typ string) (string, error) {
	if !eventType.MatchString(typ) {
		return "", fmt.Errorf("event type %q: use lower-case words joined by dots, e.g. payment.captured", typ)
	}
	dir := filepath.Join(internalDir, mod)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("module %s: %w", mod, err)
	}
	name := eventConstant(mod, typ)
	path := filepath.Join(dir, "events.go")
	src, err := os.ReadFile(path)
	report := fmt.Sprintf("added %s to %s (%s)", typ, path, name)
	if errors.Is(err, fs.ErrNotExist) {
		src, err = []byte(strings.ReplaceAll(eventsTemplate, "PKG", mod)), nil
		report = fmt.Sprintf("created %s with %s (%s)", path, typ, name)
	}
	if err != nil {
		return "", err
	}
	if bytes.Contains(src, []byte(`"`+typ+`"`)) {
		return "", fmt.Errorf("%s already declares %s", path, typ)
	}
	constant := fmt.Sprintf("\t// %s: TODO: what happened. Payload: TODO.\n\t%s = %q\n", name, name, typ)
	// The block ends at a line that is ")" alone: a ")" in a comment does not.
	out, ok := insertBefore(string(src), "const (", "\n)\n", "\n"+strings.TrimSuffix(constant, "\n"))
	if !ok {
		return "", fmt.Errorf("%s: no const ( ... ) block to add %s to", path, name)
	}
	list := regexp.MustCompile(`var Events = \[\]string\{([^}]*)\}`)
	m := list.FindStringSubmatchIndex(out)
	if m == nil {
		return "", fmt.Errorf("%s: no var Events = []string{...} to add %s to", path, name)
	}
	entries := strings.TrimRight(strings.TrimSpace(out[m[2]:m[3]]), ",")
	if entries != "" {
		entries += ", "
	}
	out = out[:m[2]] + entries + name + out[m[3]:]
	b, err := format.Source([]byte(out))
	if err != nil {
		return "", fmt.Errorf("formatting %s: %w", path, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	return report, nil
}

// eventChecklist is what new:event leaves to a person: what the event
// means, when it is emitted, and the route that emits it. The module's test
// setups subscribe to its Events list, so its tests see the new type's
// messages without a change.
func eventChecklist(mod, typ string) string {
	return strings.NewReplacer("MOD", mod, "TYPE", typ, "CONST", eventConstant(mod, typ)).Replace(`
next, by hand (docs/adding-a-module.md, "Adding an event to an existing module", walks through one):
  1. say what it means and what its payload is: CONST's comment in internal/MOD/events.go,
     its Description in internal/MOD/eventtypes.go, its data in internal/MOD/events/TYPE.schema.json
     and an example in TYPE.example.json
  2. ./task generate: writes TYPE into the webhooks of openapi/openapi.yaml
  3. enqueue it with outbox.Enqueue(ctx, tx, outbox.Event{Type: CONST, ...}) in the transaction
     that makes it true, with the entity's id as OrderingKey; a new state the table's CHECK refuses
     needs a migration (./task new:migration -- MOD NAME)
  4. the route that emits it: its handler, its path in openapi/openapi.yaml, its line in
     docs/reference.md
  5. a test: the module's setups subscribe an endpoint to MOD.Events, so TYPE is a message there;
     eventstest.CheckEvents checks its data against the schema
`)
}

// insertBefore inserts text before the first end that follows start.
func insertBefore(s, start, end, text string) (string, bool) {
	i := strings.Index(s, start)
	if i < 0 {
		return s, false
	}
	j := strings.Index(s[i+len(start):], end)
	if j < 0 {
		return s, false
	}
	at := i + len(start) + j
	return s[:at] + text + s[at:], true
}

// eventsTemplate is a module's events.go before its first event.
const eventsTemplate = `package PKG

// The events this module emits, as endpoints subscribe to them. Each is
// enqueued with outbox.Enqueue in the transaction that makes it true, with
// a snapshot of what was true there as its payload; receivers deduplicate
// on the webhook-id. A payload is a contract: add fields, never change or
// remove them.
const (
)

// Events lists every event type the module emits: cmd/dev subscribes its
// demo receiver to all of them.
var Events = []string{}
`

// addToSQLC adds a migration to the schema list of mod's block in the sqlc
// configuration at path, creating the block (with its queries directory and
// generated package) for a module's first migration.
func addToSQLC(path, mod, migration string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	file := filepath.ToSlash(migration)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	start := slices.Index(lines, "  - name: "+mod)
	if start < 0 {
		block := strings.ReplaceAll(strings.ReplaceAll(sqlcBlock, "MODULE", mod), "FILE", file)
		return os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"+block), 0o644)
	}
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "  - ") {
			end = i
			break
		}
	}
	for i := start + 1; i < end; i++ {
		value, ok := strings.CutPrefix(lines[i], "    schema:")
		if !ok {
			continue
		}
		var list []string
		if value = strings.TrimSpace(value); value != "" {
			list = append(list, "      - "+value) // one file: becomes a list
		}
		k := i + 1
		for ; k < end && strings.HasPrefix(lines[k], "      - "); k++ {
			list = append(list, lines[k])
		}
		list = append(list, "      - "+file)
		out := slices.Concat(lines[:i], []string{"    schema:"}, list, lines[k:])
		return os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644)
	}
	return fmt.Errorf("%s: the %s block has no schema", path, mod)
}

// sqlcBlock is a new module's block in sqlc.yaml: its own queries and its
// own generated package, private to the module.
const sqlcBlock = `  - name: MODULE
    engine: postgresql
    schema:
      - FILE
    queries: db/queries/MODULE
    gen:
      go:
        <<: *go
        package: MODULEdb
        out: internal/MODULE/internal/MODULEdb
`

var migrationTemplate = mustTemplate()
