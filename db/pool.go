package db

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
//     80 messages/s instead of 4,500 (docs/PERFORMANCE.md, section 12).
//     Every statement here reads or writes a few rows through an index;
//     none runs long enough for compiled code to pay for its compilation.
func ConfigurePool(cfg *pgxpool.Config) {
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
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
