package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Partitions is the partitions of the outbox tables at a glance: how far
// ahead of the writes they are made, and the oldest one kept, with what
// keeps it. The worker's prune job makes them ahead and drops the oldest
// once every message in it is settled and past its retention.
type Partitions struct {
	Count int `json:"count"`
	// AheadSeconds is how long until the writes reach the end of the
	// newest partition: an order transaction fails at zero.
	AheadSeconds float64 `json:"ahead_seconds"`
	// Oldest names the oldest partition (legacy, or p20261207t0000 for
	// the one from that time), and OldestAgeSeconds is how long ago its
	// last id's time passed.
	Oldest           string  `json:"oldest"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	// OldestHeldBy is what is in the oldest partition: "claimed",
	// "pending" or "failed" when a message in it is (the first found, in
	// that order); "settled" when its messages are all delivered or
	// discarded, so that it goes once they are past their retention; ""
	// when it holds none.
	OldestHeldBy string `json:"oldest_held_by"`
}

// readPartitions reads the partitions from the catalog, and the oldest's
// messages by a few probes of its partial indexes.
func readPartitions(ctx context.Context, q *outboxdb.Queries) (Partitions, error) {
	st, err := q.PartitionsState(ctx)
	if err != nil {
		return Partitions{}, fmt.Errorf("reading outbox partitions: %w", err)
	}
	p := Partitions{Count: int(st.Partitions), AheadSeconds: st.AheadSeconds, Oldest: st.Oldest, OldestAgeSeconds: st.OldestAgeSeconds}
	if p.Count == 0 {
		return p, nil
	}
	// Settled at any time counts: the retention is the worker's setting.
	held, err := q.PartitionHeld(ctx, st.OldestLo, st.OldestHi, time.Unix(0, 0))
	if err != nil {
		return Partitions{}, fmt.Errorf("reading the oldest outbox partition: %w", err)
	}
	if held == "retention" {
		held = "settled"
	}
	p.OldestHeldBy = held
	return p, nil
}
