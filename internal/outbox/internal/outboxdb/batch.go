package outboxdb

// Written by hand, beside the code sqlc generates: sqlc's batch queries
// send a batch of their own, while these queue a statement on the caller's
// batch, to share its round trip. The arguments follow the generated
// methods of the same names; the tests that send them check they still do.

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// QueueEventEnqueue queues EventEnqueue on b; the event's id is stored in id
// when b's results are read.
func QueueEventEnqueue(b *pgx.Batch, arg EventEnqueueParams, id *uuid.UUID) {
	b.Queue(eventEnqueue, arg.Type, arg.Payload, arg.TraceContext, arg.OrderingKey).
		QueryRow(func(row pgx.Row) error { return row.Scan(id) })
}

// QueueEventNotify queues EventNotify on b.
func QueueEventNotify(b *pgx.Batch, typ string) {
	b.Queue(eventNotify, typ)
}
