// Package labsql reads the product's SQL statements from db/queries, the
// files sqlc generates the product's code from, so the lab (the bench, the
// workshop) runs the very statements the product runs, never a pasted copy
// that could drift from them.
package labsql

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Statement is one named query, ready to run with positional arguments.
type Statement struct {
	// SQL has its sqlc parameters numbered $1, $2, … in the order they
	// first appear.
	SQL string
	// Params names the parameters in that order.
	Params []string
}

// Args orders named arguments as the statement's parameters; every
// parameter must be given.
func (s Statement) Args(named map[string]any) ([]any, error) {
	args := make([]any, len(s.Params))
	for i, p := range s.Params {
		v, ok := named[p]
		if !ok {
			return nil, fmt.Errorf("no argument for parameter %q", p)
		}
		args[i] = v
	}
	return args, nil
}

var (
	nameLine = regexp.MustCompile(`(?m)^-- name: (\w+) :\w+\s*$`)
	param    = regexp.MustCompile(`sqlc\.n?arg\((\w+)\)|@(\w+)`)
)

// Query returns the query called name in the .sql files under
// db/queries/<module> (the relay's are in a folder of their own).
func Query(module, name string) (Statement, error) {
	root, err := moduleRoot()
	if err != nil {
		return Statement{}, err
	}
	var files []string
	err = filepath.WalkDir(filepath.Join(root, "db", "queries", module), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".sql") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		return Statement{}, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return Statement{}, err
		}
		if body, ok := find(string(b), name); ok {
			return number(body), nil
		}
	}
	return Statement{}, fmt.Errorf("no query %s in db/queries/%s", name, module)
}

// MustQuery is Query for statements the lab cannot run without.
func MustQuery(module, name string) Statement {
	s, err := Query(module, name)
	if err != nil {
		panic(err)
	}
	return s
}

// find returns the text of query name in a sqlc query file: from its
// "-- name:" line to the next one, without the comment lines.
func find(file, name string) (string, bool) {
	marks := nameLine.FindAllStringSubmatchIndex(file, -1)
	for i, m := range marks {
		if file[m[2]:m[3]] != name {
			continue
		}
		end := len(file)
		if i+1 < len(marks) {
			end = marks[i+1][0]
		}
		var lines []string
		for l := range strings.SplitSeq(file[m[1]:end], "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, l)
			}
		}
		return strings.TrimSuffix(strings.TrimSpace(strings.Join(lines, "\n")), ";"), true
	}
	return "", false
}

// number replaces sqlc's named parameters with positional ones.
func number(body string) Statement {
	var s Statement
	index := map[string]int{}
	s.SQL = param.ReplaceAllStringFunc(body, func(m string) string {
		sub := param.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		n, ok := index[name]
		if !ok {
			s.Params = append(s.Params, name)
			n = len(s.Params)
			index[name] = n
		}
		return fmt.Sprintf("$%d", n)
	})
	return s
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod: the repository root, whether the lab runs from there (go run) or
// from its package directory (go test).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("labsql: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// The prune job's statements: settled messages first, then the events no
// message refers to any more.
var (
	prune       = MustQuery("outbox", "MessagesPrune")
	pruneEvents = MustQuery("outbox", "EventsPrune")
)

// pruneBatch is the prune job's batch size (internal/outbox: pruneBatch).
const pruneBatch = 5000

// Prune deletes what the relay's prune job deletes, with its statements:
// the settled (delivered and discarded) messages older than cutoff, in
// batches of at most 5,000 of each until a batch deletes nothing, then the
// events written before cutoff that no message refers to any more, looking
// at 5,000 a batch from where the last one stopped. It returns how many
// messages and events it deleted.
func Prune(ctx context.Context, db Execer, cutoff time.Time) (messages, events int64, err error) {
	// Every id: the batched DELETE as the prune job runs it on a partition
	// past its retention that a pending message keeps, here on all of them.
	args, err := prune.Args(map[string]any{"settled_before": cutoff, "batch_size": pruneBatch,
		"kept_before": uuid.Max})
	if err != nil {
		return 0, 0, err
	}
	for {
		var n int64
		if err := db.QueryRow(ctx, prune.SQL, args...).Scan(&n); err != nil {
			return messages, 0, fmt.Errorf("pruning messages: %w", err)
		}
		messages += n
		if n == 0 {
			break
		}
	}
	for after := uuid.Nil; ; {
		if args, err = pruneEvents.Args(map[string]any{"created_before": cutoff, "batch_size": pruneBatch, "after": after}); err != nil {
			return messages, events, err
		}
		var scanned, deleted int64
		if err := db.QueryRow(ctx, pruneEvents.SQL, args...).Scan(&scanned, &deleted, &after); err != nil {
			return messages, events, fmt.Errorf("pruning events: %w", err)
		}
		events += deleted
		if scanned < pruneBatch {
			return messages, events, nil
		}
	}
}
