package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
}

// The rules, for every package and its tests:
//
//  1. Nothing under internal/ imports cmd/: programs wire modules, never
//     the other way round.
//  2. A module is a directory internal/X with generated code of its own
//     (internal/X/internal/...). The outbox imports no other module; any
//     other module may import the outbox, and no other module: modules
//     talk to each other through events.
//  3. A generated package (internal/X/internal/Xdb) is imported only from
//     inside its module, internal/X/... (Go's internal rule enforces this
//     too; the test says it in the rule's words).
//  4. Another module's code imports the outbox's root package alone
//     (Event, Enqueue, Queue, the statuses), never its engine (relay), its
//     admin or its other packages: those are for the programs that wire
//     them (cmd/, apiserver, relayworker) and for the ops page, the
//     operators' face of the outbox's admin (a module only for the
//     sessions it keeps). Tests may drive them.
func TestImportRules(t *testing.T) {
	mod := goList(t, "-m")
	pkgs := listPackages(t)
	internal := mod + "/internal/"
	moduleOf := func(p string) string { // "orders" for mod/internal/orders/..., else ""
		rest, ok := strings.CutPrefix(p, internal)
		if !ok {
			return ""
		}
		name, _, _ := strings.Cut(rest, "/")
		return name
	}
	modules := map[string]bool{}
	for _, p := range pkgs {
		if name := moduleOf(p.ImportPath); name != "" && strings.HasPrefix(p.ImportPath, internal+name+"/internal/") {
			modules[name] = true
		}
	}
	if !modules["outbox"] || !modules["orders"] {
		t.Fatalf("expected the outbox and orders modules, found %v", modules)
	}
	var violations []string
	for _, p := range pkgs {
		from := moduleOf(p.ImportPath)
		for _, imp := range append(append(append([]string{}, p.Imports...), p.TestImports...), p.XTestImports...) {
			if from != "" && (imp == mod+"/cmd" || strings.HasPrefix(imp, mod+"/cmd/")) {
				violations = append(violations, p.ImportPath+" imports "+imp+": nothing under internal/ imports cmd/")
			}
			to := moduleOf(imp)
			if to == "" || to == from || !modules[to] {
				continue
			}
			if modules[from] && (from == "outbox" || to != "outbox") {
				violations = append(violations, p.ImportPath+" imports "+imp+": module "+from+" may import the outbox module only")
			}
			if to == "outbox" && modules[from] && from != "ops" && imp != internal+"outbox" && slices.Contains(p.Imports, imp) {
				violations = append(violations, p.ImportPath+" imports "+imp+": another module imports the outbox's root package only")
			}
			if rest := strings.TrimPrefix(imp, internal+to); strings.HasPrefix(rest, "/internal/") && strings.HasSuffix(path.Base(imp), "db") {
				violations = append(violations, p.ImportPath+" imports "+imp+": a generated package is private to its module")
			}
		}
	}
	for _, v := range violations {
		t.Error(v)
	}
}

func goList(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.TrimSpace(string(out))
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	root := goList(t, "-m", "-f", "{{.Dir}}")
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// The production programs never carry a throwaway database: only cmd/dev
// may fall back to one (embedded-postgres downloads and runs a server),
// while cmd/api and cmd/worker require DATABASE_URL.
func TestProductionProgramsDoNotLinkADevelopmentDatabase(t *testing.T) {
	mod := goList(t, "-m")
	root := goList(t, "-m", "-f", "{{.Dir}}")
	deps := func(prog string) []string {
		cmd := exec.Command("go", "list", "-deps", "./"+prog)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v", prog, err)
		}
		return strings.Fields(string(out))
	}
	isDevDB := func(dep string) bool {
		return strings.Contains(dep, "embedded-postgres") || dep == mod+"/internal/devdb"
	}
	for _, prog := range []string{"cmd/api", "cmd/worker"} {
		for _, dep := range deps(prog) {
			if isDevDB(dep) {
				t.Errorf("%s links %s", prog, dep)
			}
		}
	}
	// The control: the development program does link it.
	if !slices.ContainsFunc(deps("cmd/dev"), isDevDB) {
		t.Error("cmd/dev no longer links the development database: the check above proves nothing")
	}
}
