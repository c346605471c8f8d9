// Command workshop teaches the dual-write problem and the transactional
// outbox with labs that run for real: each against its own fresh PostgreSQL
// database on the local server (cloned from the migrated template, dropped
// at the end) and real HTTP receivers on 127.0.0.1. Each lab injects a
// failure, shows its progress, and prints a short report with counts.
//
//	workshop [flags] LAB       LAB is 1 to 10, "all" or "list"
//	./task workshop -- 3       the same, through the Taskfile
//
// lab/workshop/README.md walks an instructor through the labs. The server is
// TEST_DATABASE_URL, else DATABASE_URL, else postgres://postgres@127.0.0.1:5432.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/term"
)

type labDef struct {
	title string
	run   func(*lab) (*Report, error)
}

// labs, in teaching order.
var labs = []labDef{
	{"Publish, then commit", lab1},
	{"Commit, then publish", lab2},
	{"The outbox", lab3},
	{"Two relays: without a claim, with a lock, with SKIP LOCKED, and the outbox relay", lab4},
	{"A relay dies holding claims", lab5},
	{"A poison message", lab6},
	{"Per-key order", lab7},
	{"Growth and pruning", lab8},
	{"Head-of-line blocking", lab9},
	{"The broker's dedup window and the consumer's inbox", lab10},
}

func main() {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "workshop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("workshop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts options
	fs.IntVar(&opts.N, "n", 0, "orders or messages per lab (0: the lab's default, sized to run in seconds)")
	fs.IntVar(&opts.History, "history", 0, "lab 8: delivered rows of history (0: 100000)")
	fs.DurationVar(&opts.Window, "window", 0, "lab 9: how long each relay is watched (0: 2s)")
	fs.Uint64Var(&opts.Seed, "seed", 0, "random seed for which orders fail (0: random)")
	fs.BoolVar(&opts.Verbose, "v", false, "show the relay's warnings")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: workshop [flags] LAB   (LAB: 1-10, all, list; flags may follow LAB)")
		for i, l := range labs {
			fmt.Fprintf(stderr, "  %d  %s\n", i+1, l.title)
		}
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return errors.New("which lab?")
	}
	which := rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		return err
	}
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	var nums []int
	switch which {
	case "list":
		for i, l := range labs {
			fmt.Fprintf(stdout, "%d  %s\n", i+1, l.title)
		}
		return nil
	case "all":
		for i := range labs {
			nums = append(nums, i+1)
		}
	default:
		n, err := strconv.Atoi(which)
		if err != nil || n < 1 || n > len(labs) {
			fs.Usage()
			return fmt.Errorf("no lab %q", which)
		}
		nums = []int{n}
	}
	for i, n := range nums {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if _, err := runLab(ctx, n, opts, stdout, stderr, tty); err != nil {
			return fmt.Errorf("lab %d: %w", n, err)
		}
	}
	return nil
}

// runLab runs lab n: progress goes to progressW, the report to reportW.
func runLab(ctx context.Context, n int, opts options, reportW, progressW io.Writer, tty bool) (*Report, error) {
	def := labs[n-1]
	fmt.Fprintf(progressW, "Lab %d: %s\n", n, def.title)
	p := newProgress(progressW, tty)
	logw := io.Discard
	if opts.Verbose {
		logw = progressW
	}
	l, err := newLab(ctx, opts, p, logw)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rep, err := def.run(l)
	p.Step("cleaning up (dropping the lab's database)")
	l.close()
	p.Done()
	if rep != nil {
		fmt.Fprintf(progressW, "  (%s)\n\n", seconds(time.Since(start)))
		rep.Write(reportW)
	}
	return rep, err
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
