package outboxdb

// Written by hand, beside the code sqlc generates: sqlc's batch queries
// send a batch of their own, while these queue a statement on the caller's
// batch, to share its round trip. The arguments follow the generated
// methods of the same names (TestQueueFunctionsSendWhatTheGeneratedMethodsSend).

import (
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// QueueTransactionPlanGeneric queues TransactionPlanGeneric on b: the
// statements queued after it run under a generic plan.
func QueueTransactionPlanGeneric(b *pgx.Batch) {
	b.Queue(transactionPlanGeneric)
}

// QueueMessageClaim queues MessageClaim on b; the claimed rows are stored in
// rows when b's results are read.
func QueueMessageClaim(b *pgx.Batch, arg MessageClaimParams, rows *[]MessageClaimRow) {
	b.Queue(messageClaim, arg.Destination, arg.ClaimToken, arg.BatchSize, arg.RelayID).
		Query(func(r pgx.Rows) error {
			var err error
			*rows, err = pgx.CollectRows(r, func(row pgx.CollectableRow) (MessageClaimRow, error) {
				var i MessageClaimRow
				err := row.Scan(&i.ID, &i.EventID, &i.Type, &i.Payload, &i.Attempts, &i.CreatedAt,
					&i.TraceContext, &i.OrderingKey, &i.EndpointUrl, &i.EndpointSecret, &i.EndpointPreviousSecret)
				return i, err
			})
			return err
		})
}

// QueueDestinationLock queues DestinationLock on b: the statements queued
// after it run under the destination's lock.
func QueueDestinationLock(b *pgx.Batch, destination uuid.UUID) {
	b.Queue(destinationLock, destination)
}

// QueueMessagesRecordOutcomes queues MessagesRecordOutcomes on b; the rows
// it recorded are stored in rows when b's results are read.
func QueueMessagesRecordOutcomes(b *pgx.Batch, arg MessagesRecordOutcomesParams, rows *[]MessagesRecordOutcomesRow) {
	b.Queue(messagesRecordOutcomes, arg.Ids, arg.Statuses, arg.DelaysSeconds, arg.LastErrors, arg.Attempts,
		arg.Outcomes, arg.StartedAts, arg.FinishedAts, arg.StatusCodes, arg.EventAts, arg.ClaimToken,
		arg.FirstID, arg.LastID).
		Query(func(r pgx.Rows) error {
			var err error
			*rows, err = pgx.CollectRows(r, func(row pgx.CollectableRow) (MessagesRecordOutcomesRow, error) {
				var i MessagesRecordOutcomesRow
				err := row.Scan(&i.ID, &i.Attempts, &i.Status)
				return i, err
			})
			return err
		})
}

// QueueMessagesRelease queues MessagesRelease on b; how many it released is
// stored in n, when n is not nil, when b's results are read.
func QueueMessagesRelease(b *pgx.Batch, ids []uuid.UUID, claimToken uuid.UUID, n *int64) {
	queueExec(b, n, messagesRelease, ids, claimToken)
}

// QueueMessagesPromote queues MessagesPromote on b; how many it promoted
// is stored in n, when n is not nil, when b's results are read.
func QueueMessagesPromote(b *pgx.Batch, keys []string, destination uuid.UUID, n *int64) {
	queueExec(b, n, messagesPromote, keys, destination)
}

func queueExec(b *pgx.Batch, n *int64, sql string, args ...any) {
	b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
		if n != nil {
			*n = tag.RowsAffected()
		}
		return nil
	})
}

// QueueDestinationLease queues DestinationLease on b; the lease's row is
// stored in row, and found set to whether there was one, when b's results
// are read.
func QueueDestinationLease(b *pgx.Batch, leaseToken, relayID, id uuid.UUID, row *DestinationLeaseRow, found *bool) {
	b.Queue(destinationLease, leaseToken, relayID, id).QueryRow(func(r pgx.Row) error {
		err := r.Scan(&row.Url, &row.Health, &row.HealthReason, &row.HealthChangedAt, &row.ConsecutiveFailures,
			&row.BackoffUntil, &row.Pace)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*found = err == nil
		return err
	})
}

// QueueDestinationSettle queues DestinationSettle on b; due is stored, and
// held set to whether the job still held the lease (a row came back), when
// b's results are read.
func QueueDestinationSettle(b *pgx.Batch, arg DestinationSettleParams, due, held *bool) {
	b.Queue(destinationSettle, arg.Url, arg.Health, arg.HealthReason, arg.ConsecutiveFailures, arg.BackoffUntil,
		arg.Pace, arg.Gone, arg.ID, arg.LeaseToken).QueryRow(func(r pgx.Row) error {
		err := r.Scan(due)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*held = err == nil
		return err
	})
}
