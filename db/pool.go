package db

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// runtimeDefaults are the settings ConfigurePool gives every connection
// whose URL does not set them.
var runtimeDefaults = map[string]string{
	"jit":                                 "off",
	"idle_in_transaction_session_timeout": "1min",
}

// ConfigurePool sets up every connection of the pool for the product's
// statements:
//
//   - uuid.UUID (github.com/google/uuid, the type of every id in the
//     generated code) is sent and read as PostgreSQL's 16-byte binary uuid
//     (see RegisterUUID);
//   - JIT compilation is off (jit=off), unless the URL sets jit itself.
//     PostgreSQL compiles a statement when the planner's cost estimate
//     passes jit_above_cost, and the estimate follows the table, not the
//     rows a statement touches: with millions of messages waiting for one
//     endpoint (an outage), each claim of 32 of them, an index range read of
//     a millisecond, spent about 400 ms compiling, and the relay drained
//     about 70 messages/s instead of 7,900 (as the lab's bench measured it).
//     Every statement here reads or writes a few rows through an index;
//     none runs long enough for compiled code to pay for its compilation.
//   - a transaction left idle for a minute is ended by the server
//     (idle_in_transaction_session_timeout=1min), unless the URL sets it: no
//     transaction of the product waits on anything but its own statements,
//     so one idle that long belongs to a process that hung or lost its
//     network mid-transaction, and its row locks (a claim's, an endpoint's
//     lease) would otherwise hold every other worker up until TCP keepalive
//     gives up, hours later.
func ConfigurePool(cfg *pgxpool.Config) {
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	for name, value := range runtimeDefaults {
		if _, set := cfg.ConnConfig.RuntimeParams[name]; !set {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
	next := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		RegisterUUID(conn.TypeMap())
		if next != nil {
			return next(ctx, conn)
		}
		return nil
	}
}

// StatementCanceled reports whether err is PostgreSQL's cancellation of a
// statement (SQLSTATE 57014): it ran past statement_timeout, or its client
// asked, as pgx does when a request's context ends. Either way it is a
// statement that took too long, not a defect.
func StatementCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014" // query_canceled
}
