package admin

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

// ErrInvalidReplay is returned for a replay that cannot run: a missing,
// empty or reversed time range, a batch size out of bounds, or an event
// type that is not text.
var ErrInvalidReplay = errors.New("outbox: invalid replay")

// MaxReplayBatch bounds the events one Replay call reads: each call is one
// short transaction, whatever the range.
const MaxReplayBatch = 1000

// replayScan bounds the events of the range, of any type, one call looks
// at, as a multiple of its batch: a call replaying a type that is rare in
// the range ends after that many and returns a cursor, with few or none
// read.
const replayScan = 10

// Replay asks for the events written in [From, To) to be sent again to one
// endpoint.
type Replay struct {
	From, To time.Time
	// EventTypes narrows the replay to these types; empty means every type
	// the endpoint subscribes to (a type it does not subscribe to is never
	// replayed to it).
	EventTypes []string
	// After is the cursor of a replay in progress: the previous call's
	// ReplayResult.Next (the last event it looked at, which may be one it
	// did not replay). Nil starts at From.
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
	// the range is done. A call may read none of the range's events and
	// still return one: it looked at as many as it may without finding its
	// types.
	Next *uuid.UUID `json:"next,omitempty"`
}

func (r Replay) check() error {
	if r.From.IsZero() || r.To.IsZero() {
		return invalid(ErrInvalidReplay, "from and to are both required")
	}
	if !r.From.Before(r.To) {
		return invalid(ErrInvalidReplay, "from must be before to")
	}
	if r.Limit < 0 || r.Limit > MaxReplayBatch {
		return invalid(ErrInvalidReplay, "limit must be from 1 to %d", MaxReplayBatch)
	}
	for _, t := range r.EventTypes {
		if !isText(t) {
			return invalid(ErrInvalidReplay, "an event type must be UTF-8 text without NUL")
		}
	}
	return nil
}

// Event ids carry their time in milliseconds since 1970 in 48 bits: the
// times an id can bound.
var (
	idTimeMin = time.Unix(0, 0)
	idTimeMax = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

// idRange is [From, To) within the times an event id can hold (idTimes).
func (r Replay) idRange() (from, to time.Time) { return idTimes(r.From, r.To) }

// idTimes bounds a time range to the times an event id can hold, so that a
// range reaching before 1970 means from the first event, not none, and one
// ending before 1970 holds nothing (outbox_uuid_at of a time before 1970 is
// an id above every other: as an upper bound it let everything through).
func idTimes(from, to time.Time) (time.Time, time.Time) {
	return clampIDTime(from), clampIDTime(to)
}

func clampIDTime(t time.Time) time.Time {
	if t.Before(idTimeMin) {
		return idTimeMin
	}
	if t.After(idTimeMax) {
		return idTimeMax
	}
	return t
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
func (a *Service) ReplayEvents(ctx context.Context, endpoint uuid.UUID, r Replay) (ReplayResult, error) {
	if err := r.check(); err != nil {
		return ReplayResult{}, err
	}
	var res ReplayResult
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) (err error) {
		res, err = replayBatch(ctx, tx, endpoint, r)
		return err
	})
	if err != nil {
		return ReplayResult{}, err
	}
	a.logger.InfoContext(ctx, "events replayed", slog.String("endpoint_id", endpoint.String()),
		slog.Time("from", r.From), slog.Time("to", r.To), slog.Int("read", res.Read), slog.Int("replayed", res.Replayed),
		slog.Bool("more", res.Next != nil))
	return res, nil
}

// replayBatch is one ReplayEvents call's work, in its transaction.
func replayBatch(ctx context.Context, tx pgx.Tx, endpoint uuid.UUID, r Replay) (ReplayResult, error) {
	q := outboxdb.New(tx)
	if _, err := q.EndpointGet(ctx, endpoint); err != nil {
		return ReplayResult{}, notFound("getting endpoint", err)
	}
	// The prune waits while events are read and given messages.
	if err := q.EventsLockReplay(ctx); err != nil {
		return ReplayResult{}, fmt.Errorf("locking events: %w", err)
	}
	// Another replay of the endpoint waits until this one has committed.
	if err := q.EndpointLockReplay(ctx, endpoint); err != nil {
		return ReplayResult{}, fmt.Errorf("locking the endpoint's replays: %w", err)
	}
	from, to := r.idRange()
	limit := cmp.Or(r.Limit, MaxReplayBatch)
	row, err := q.EndpointReplay(ctx, outboxdb.EndpointReplayParams{
		Endpoint: endpoint, FromTime: from, ToTime: to, After: r.After,
		Types: r.EventTypes, BatchSize: int32(limit), ScanLimit: int32(replayScan * limit),
	})
	if err != nil {
		return ReplayResult{}, fmt.Errorf("replaying events: %w", err)
	}
	res := ReplayResult{Read: int(row.Read), Replayed: int(row.Replayed)}
	if row.Next != uuid.Nil {
		res.Next = &row.Next
	}
	return res, nil
}

// DryRun is what one ReplayCount call found.
type DryRun struct {
	// Events counts the events the replay would read among those the call
	// looked at: every one of the range after Replay.After when Next is
	// nil.
	Events int64 `json:"events"`
	// Next, when the call looked at as many of the range's events as a
	// replay's call scans (ten times Replay.Limit, of any type) before the
	// range's end, is the cursor to count on from (Replay.After), as a
	// replay goes on; nil when the range is done.
	Next *uuid.UUID `json:"next,omitempty"`
}

// ReplayCount says how many events a replay of r would read for the
// endpoint, from r's cursor on: what to confirm before starting one. Like
// the replay's own calls, one call reads a bounded part of the range, so a
// dry run of years costs what one of a minute does; a wider range is
// counted on from DryRun.Next.
func (a *Service) ReplayCount(ctx context.Context, endpoint uuid.UUID, r Replay) (DryRun, error) {
	if err := r.check(); err != nil {
		return DryRun{}, err
	}
	q := outboxdb.New(a.pool)
	if _, err := q.EndpointGet(ctx, endpoint); err != nil {
		return DryRun{}, notFound("getting endpoint", err)
	}
	from, to := r.idRange()
	row, err := q.EndpointReplayCount(ctx, outboxdb.EndpointReplayCountParams{
		Endpoint: endpoint, FromTime: from, ToTime: to, Types: r.EventTypes, After: r.After,
		ScanLimit: int32(replayScan * cmp.Or(r.Limit, MaxReplayBatch)),
	})
	if err != nil {
		return DryRun{}, fmt.Errorf("counting events to replay: %w", err)
	}
	d := DryRun{Events: row.Events}
	if row.Next != uuid.Nil {
		d.Next = &row.Next
	}
	return d, nil
}
