// Command promrules checks Prometheus alerting and recording rules the way
// Prometheus reads them (its rule file parser, which parses each
// expression too) and prints the metrics each rule names, one
// "metric<TAB>rule" line each, so that a test can hold them to the metrics
// the service exports. It reads the rules (YAML) from standard input and
// exits 1, listing the problems, when they do not parse.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "promrules:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	content, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("reading the rules: %w", err)
	}
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintln(os.Stderr, e)
		}
		return fmt.Errorf("%d problems in the rules", len(errs))
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				return fmt.Errorf("rule %s: %w", name, err)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if v, ok := n.(*parser.VectorSelector); ok {
					fmt.Fprintf(out, "%s\t%s\n", v.Name, name)
				}
				return nil
			})
		}
	}
	return nil
}
