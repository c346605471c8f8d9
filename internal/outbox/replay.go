package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// ErrInvalidReplay is returned for a replay that cannot run: an empty or
// reversed time range, or a batch size out of bounds.
var ErrInvalidReplay = errors.New("outbox: invalid replay")

// MaxReplayBatch bounds the events one Replay call reads: each call is one
// short transaction, whatever the range.
const MaxReplayBatch = 1000

// Replay asks for the events written in [From, To) to be sent again to one
// endpoint.
type Replay struct {
	From, To time.Time
	// EventTypes narrows the replay to these types; empty means every type
	// the endpoint subscribes to (a type it does not subscribe to is never
	// replayed to it).
	EventTypes []string
	// After is the cursor of a replay in progress: the LastEventID of the
	// previous batch. Nil starts at From.
	After *uuid.UUID
	// Limit bounds the events read in this call; 0 means MaxReplayBatch.
	Limit int
}

// ReplayResult is what one Replay call did.
type ReplayResult struct {
	// Read counts the events of the range this call looked at; Replayed
	// those given a new message; the rest already had one waiting (pending,
	// claimed or failed) for the endpoint and were left alone.
	Read     int `json:"read"`
	Replayed int `json:"replayed"`
	// Next is the cursor for the following call (Replay.After), nil when
	// the range is done.
	Next *uuid.UUID `json:"next,omitempty"`
}

func (r Replay) check() error {
	if r.From.IsZero() || r.To.IsZero() || !r.From.Before(r.To) {
		return fmt.Errorf("%w: from must be before to", ErrInvalidReplay)
	}
	if r.Limit < 0 || r.Limit > MaxReplayBatch {
		return fmt.Errorf("%w: limit must be from 1 to %d", ErrInvalidReplay, MaxReplayBatch)
	}
	return nil
}

// ReplayEvents re-sends retained events to an endpoint, under their original
// event ids (webhook-id), as new pending messages due now, in event order.
// It reads at most one batch (Replay.Limit) per call, in one short
// transaction, and returns the cursor to continue with: a large range is
// replayed by calling again with After set until Next is nil, and an
// interrupted replay resumes where it stopped. An event whose message to
// the endpoint is still unfinished is not replayed: a replay never makes a
// second pending copy. Events are kept for the relay's retention
// (OUTBOX_RETENTION); older ones are gone and cannot be replayed.
func (a *Admin) ReplayEvents(ctx context.Context, endpoint uuid.UUID, r Replay) (ReplayResult, error) {
	if err := r.check(); err != nil {
		return ReplayResult{}, err
	}
	var row outboxdb.EndpointReplayRow
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		if _, err := q.EndpointGet(ctx, endpoint); err != nil {
			return notFound("getting endpoint", err)
		}
		// The prune waits while events are read and given messages.
		if err := q.EventsLockReplay(ctx); err != nil {
			return fmt.Errorf("locking events: %w", err)
		}
		var err error
		row, err = q.EndpointReplay(ctx, outboxdb.EndpointReplayParams{
			Endpoint: endpoint, FromTime: r.From, ToTime: r.To, After: r.After,
			Types: r.EventTypes, BatchSize: int32(cmp.Or(r.Limit, MaxReplayBatch)),
		})
		if err != nil {
			return fmt.Errorf("replaying events: %w", err)
		}
		return nil
	})
	if err != nil {
		return ReplayResult{}, err
	}
	res := ReplayResult{Read: int(row.Read), Replayed: int(row.Replayed)}
	if row.Read == int64(cmp.Or(r.Limit, MaxReplayBatch)) {
		res.Next = &row.LastID
	}
	a.logger.InfoContext(ctx, "events replayed", slog.String("endpoint_id", endpoint.String()),
		slog.Time("from", r.From), slog.Time("to", r.To), slog.Int("read", res.Read), slog.Int("replayed", res.Replayed),
		slog.Bool("more", res.Next != nil))
	return res, nil
}

// ReplayCount says how many events a replay of r would read for the
// endpoint (ignoring its cursor): what to confirm before starting one.
func (a *Admin) ReplayCount(ctx context.Context, endpoint uuid.UUID, r Replay) (int64, error) {
	if err := r.check(); err != nil {
		return 0, err
	}
	q := outboxdb.New(a.pool)
	if _, err := q.EndpointGet(ctx, endpoint); err != nil {
		return 0, notFound("getting endpoint", err)
	}
	n, err := q.EndpointReplayCount(ctx, outboxdb.EndpointReplayCountParams{
		Endpoint: endpoint, FromTime: r.From, ToTime: r.To, Types: r.EventTypes,
	})
	if err != nil {
		return 0, fmt.Errorf("counting events to replay: %w", err)
	}
	return n, nil
}
