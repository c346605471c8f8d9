package outboxdb

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Each Queue function sends its statement with the arguments, in the
// order, that the method sqlc generates for it sends: a parameter added to
// a query and missed in its Queue function would otherwise fail only when
// the statement runs.
func TestQueueFunctionsSendWhatTheGeneratedMethodsSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var (
		enqueue  = filled[EventEnqueueParams]()
		claim    = filled[MessageClaimParams]()
		outcomes = filled[MessagesRecordOutcomesParams]()
		settle   = filled[DestinationSettleParams]()
		ids      = []uuid.UUID{uuid.New(), uuid.New()}
		a, b, c  = uuid.New(), uuid.New(), uuid.New()
	)
	for name, tc := range map[string]struct {
		queue func(*pgx.Batch)
		call  func(*Queries)
	}{
		"EventEnqueue": {
			func(bt *pgx.Batch) { QueueEventEnqueue(bt, enqueue, new(uuid.UUID)) },
			func(q *Queries) { _, _ = q.EventEnqueue(ctx, enqueue) },
		},
		"EventNotify": {
			func(bt *pgx.Batch) { QueueEventNotify(bt, "order.placed") },
			func(q *Queries) { _ = q.EventNotify(ctx, "order.placed") },
		},
		"TransactionPlanGeneric": {
			func(bt *pgx.Batch) { QueueTransactionPlanGeneric(bt) },
			func(q *Queries) { _ = q.TransactionPlanGeneric(ctx) },
		},
		"MessageClaim": {
			func(bt *pgx.Batch) { QueueMessageClaim(bt, claim, new([]MessageClaimRow)) },
			func(q *Queries) { _, _ = q.MessageClaim(ctx, claim) },
		},
		"DestinationLock": {
			func(bt *pgx.Batch) { QueueDestinationLock(bt, a) },
			func(q *Queries) { _ = q.DestinationLock(ctx, a) },
		},
		"MessagesRecordOutcomes": {
			func(bt *pgx.Batch) { QueueMessagesRecordOutcomes(bt, outcomes, new([]MessagesRecordOutcomesRow)) },
			func(q *Queries) { _, _ = q.MessagesRecordOutcomes(ctx, outcomes) },
		},
		"MessagesRelease": {
			func(bt *pgx.Batch) { QueueMessagesRelease(bt, ids, a, nil) },
			func(q *Queries) { _, _ = q.MessagesRelease(ctx, ids, a) },
		},
		"MessagesPromote": {
			func(bt *pgx.Batch) { QueueMessagesPromote(bt, []string{"k1", "k2"}, a, nil) },
			func(q *Queries) { _, _ = q.MessagesPromote(ctx, []string{"k1", "k2"}, a) },
		},
		"DestinationLease": {
			func(bt *pgx.Batch) { QueueDestinationLease(bt, a, b, c, new(DestinationLeaseRow), new(bool)) },
			func(q *Queries) { _, _ = q.DestinationLease(ctx, a, b, c) },
		},
		"DestinationSettle": {
			func(bt *pgx.Batch) { QueueDestinationSettle(bt, settle, new(bool), new(bool)) },
			func(q *Queries) { _, _ = q.DestinationSettle(ctx, settle) },
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			tc.call(New(rec))
			require.NotEmpty(t, rec.sql, "the generated method sent its statement")
			bt := &pgx.Batch{}
			tc.queue(bt)
			require.Len(t, bt.QueuedQueries, 1)
			require.Equal(t, rec.sql, bt.QueuedQueries[0].SQL, "the same statement")
			require.Equal(t, rec.args, bt.QueuedQueries[0].Arguments, "the same arguments, in the same order")
		})
	}
}

// recorder is a DBTX that keeps the statement and arguments it was sent
// and runs nothing.
type recorder struct {
	sql  string
	args []any
}

var errNotRun = errors.New("not run")

func (r *recorder) keep(sql string, args []any) { r.sql, r.args = sql, args }

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.keep(sql, args)
	return pgconn.CommandTag{}, errNotRun
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.keep(sql, args)
	return nil, errNotRun
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.keep(sql, args)
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errNotRun }

// filled returns a T whose every field holds a value of its own, so that
// two arguments sent in each other's place differ.
func filled[T any]() T {
	var v T
	n := 0
	fill(reflect.ValueOf(&v).Elem(), &n)
	return v
}

func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(int64(*n), 0)))
			return
		}
		for i := range v.NumField() {
			fill(v.Field(i), n)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), n)
		fill(v.Index(1), n)
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), n)
		}
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)) + string(rune('a'+*n/26%26)))
	case reflect.Bool:
		v.SetBool(*n%2 == 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n % 100))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n % 200))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	}
}
