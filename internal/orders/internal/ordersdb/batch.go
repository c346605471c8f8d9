package ordersdb

// Written by hand, beside the code sqlc generates: sqlc's batch queries
// send a batch of their own, while this queues a statement on the caller's
// batch, to share its round trip. The arguments follow the generated
// method of the same name; the tests that place orders check they still do.

import "github.com/jackc/pgx/v5"

// QueueOrderLinesInsert queues OrderLinesInsert on b.
func QueueOrderLinesInsert(b *pgx.Batch, arg OrderLinesInsertParams) {
	b.Queue(orderLinesInsert, arg.OrderID, arg.Quantities, arg.UnitPricesCents, arg.Skus)
}
