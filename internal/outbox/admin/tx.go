package admin

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// deadlockRetries is how many times inTx runs a transaction again after
// PostgreSQL aborted it to break a deadlock.
const deadlockRetries = 3

// inTx runs fn in a transaction, as pgx.BeginFunc does, and runs it again
// when PostgreSQL aborted it to break a deadlock (SQLSTATE 40P01). A deliver
// job's end and an endpoint's deletion each lock several of one
// destination's messages, each in its own order (the rows a job recorded,
// then those it releases; the deletion's claimed rows as its scan finds
// them): each may hold a row the other waits for. PostgreSQL finds the
// cycle after deadlock_timeout (1 s) and aborts one of the two, whose locks
// then let the other finish; run again, the aborted one finds the rows
// settled and finishes too. fn must be safe to run again: it is, when it
// only writes through tx.
func inTx(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(pgx.Tx) error,
) error {
	for try := 0; ; try++ {
		err := pgx.BeginFunc(ctx, db, fn)
		if try < deadlockRetries && isDeadlock(err) {
			continue
		}
		return err
	}
}

// isDeadlock says whether err is PostgreSQL's abort of a transaction to
// break a deadlock.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
