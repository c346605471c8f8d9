package apiserver_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// registeredRoutes reads the patterns registered on the api's muxes from
// their source: every Handle and HandleFunc call of the packages that
// build them, its pattern a string or a constant expression of strings.
// http.ServeMux cannot list its patterns, and a list kept here would miss
// the next route.
func registeredRoutes(t *testing.T) []string {
	t.Helper()
	var routes []string
	for _, dir := range []string{".", "../process", "../ops", "../outbox/admin", "../orders"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		fset := token.NewFileSet()
		var parsed []*ast.File
		consts := map[string]ast.Expr{}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			require.NoError(t, err)
			parsed = append(parsed, f)
			for _, d := range f.Decls {
				if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
					for _, spec := range g.Specs {
						vs := spec.(*ast.ValueSpec)
						for i, n := range vs.Names {
							if i < len(vs.Values) {
								consts[n.Name] = vs.Values[i]
							}
						}
					}
				}
			}
		}
		var eval func(ast.Expr) (string, bool)
		eval = func(e ast.Expr) (string, bool) {
			switch e := e.(type) {
			case *ast.BasicLit:
				if e.Kind == token.STRING {
					s, err := strconv.Unquote(e.Value)
					return s, err == nil
				}
			case *ast.Ident:
				if v, ok := consts[e.Name]; ok {
					return eval(v)
				}
			case *ast.BinaryExpr:
				if e.Op == token.ADD {
					x, okx := eval(e.X)
					y, oky := eval(e.Y)
					return x + y, okx && oky
				}
			}
			return "", false
		}
		for _, f := range parsed {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 2 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
					return true
				}
				pattern, ok := eval(call.Args[0])
				require.True(t, ok, "%s: a route whose pattern is not a constant: read it here", fset.Position(call.Pos()))
				routes = append(routes, pattern)
				return true
			})
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(routes)))
}
