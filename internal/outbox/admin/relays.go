package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Relay states, as GET /outbox/relays and the ops page name them.
const (
	// RelayRunning: at least one relay is alive, and what is due is being
	// claimed.
	RelayRunning = "running"
	// RelayStalled: relays are alive, but a message has been due for longer
	// than the stall threshold and none of them has claimed anything for as
	// long (a relay wedged on its database, a deploy that dropped the
	// deliver queue, a saturated pool).
	RelayStalled = "stalled"
	// RelayDown: no relay has heartbeated within its relay timeout: nothing
	// is delivered, whatever the endpoints' own health says.
	RelayDown = "down"
)

// DefaultStallThreshold is how long a due message may wait, with no claim
// by any relay, before the relay counts as stalled.
const DefaultStallThreshold = 2 * time.Minute

// WithStallThreshold sets how long a message may be due, with no relay
// claiming anything, before RelayStatus says the relay is stalled; 0 keeps
// DefaultStallThreshold.
func WithStallThreshold(d time.Duration) Option {
	return func(a *Service) { a.stallThreshold = d }
}

// RelayProcess is one relay process (a cmd/worker) as outbox_relays knows
// it.
type RelayProcess struct {
	ID          uuid.UUID `json:"id"`
	Hostname    string    `json:"hostname"`
	PID         int       `json:"pid"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// LastClaimAt is its latest claim as of its latest heartbeat (nil
	// before its first).
	LastClaimAt *time.Time `json:"last_claim_at,omitempty"`
	// Alive: its heartbeat is younger than its relay timeout. A killed
	// relay's row stays, silent, until a live relay reaps it.
	Alive bool `json:"alive"`
	// Leader: River elected it to insert the periodic jobs (the prune, the
	// orphan discard, the chores); deliveries never depend on it.
	Leader bool `json:"leader"`
}

// RiverLeader is River's elected leader among the relays' River clients.
type RiverLeader struct {
	// ID is the leading client's id: a relay's id.
	ID        string    `json:"id"`
	ElectedAt time.Time `json:"elected_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// RelayStatus says whether anyone is delivering: the relay processes, River's
// leader, and whether what is due is being claimed.
type RelayStatus struct {
	// State is RelayRunning, RelayStalled or RelayDown; Reason says why in
	// a sentence for a person (empty while running).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Alive counts the live relays among Relays.
	Alive  int            `json:"alive"`
	Relays []RelayProcess `json:"relays"`
	// Leader is nil when no leader is elected (no relay runs River).
	Leader *RiverLeader `json:"leader,omitempty"`
	// LastClaimAt is the latest claim of any relay.
	LastClaimAt *time.Time `json:"last_claim_at,omitempty"`
	// The pending messages that are not parked, by what they wait for:
	// Due now (overdue by up to OldestDueSeconds), Scheduled (a retry or
	// their endpoint's backoff lies ahead) or a Paused endpoint.
	Due              int64   `json:"due"`
	OldestDueSeconds float64 `json:"oldest_due_seconds"`
	Scheduled        int64   `json:"scheduled"`
	Paused           int64   `json:"paused"`
	// StallThresholdSeconds is the threshold the state was judged by.
	StallThresholdSeconds float64 `json:"stall_threshold_seconds"`
}

// Relays reads the relays' liveness from PostgreSQL (their heartbeats and
// last claims, River's leader) and the due backlog, and judges the state:
// down when no relay is alive, stalled when a message has been due for
// longer than the stall threshold and no relay claimed anything for as long.
func (a *Service) Relays(ctx context.Context) (RelayStatus, error) {
	return withBacklog(ctx, a.pool, 0, func(q *outboxdb.Queries, b backlog) (RelayStatus, error) {
		return a.relays(ctx, q, b)
	})
}

func (a *Service) relays(ctx context.Context, q *outboxdb.Queries, b backlog) (RelayStatus, error) {
	rows, err := q.RelaysList(ctx)
	if err != nil {
		return RelayStatus{}, fmt.Errorf("listing relays: %w", err)
	}
	pending := b.totals()
	leader, err := riverpgxv5.New(a.pool).GetExecutor().LeaderGetElectedLeader(ctx, &riverdriver.LeaderGetElectedLeaderParams{})
	switch {
	case errors.Is(err, rivertype.ErrNotFound):
		leader = nil
	case err != nil:
		return RelayStatus{}, fmt.Errorf("reading river's leader: %w", err)
	}
	threshold := cmp.Or(a.stallThreshold, DefaultStallThreshold)
	s := RelayStatus{Relays: make([]RelayProcess, len(rows)), Due: pending.Due, OldestDueSeconds: pending.OldestDueSeconds,
		Scheduled: pending.Scheduled, Paused: pending.Paused, StallThresholdSeconds: threshold.Seconds()}
	if leader != nil {
		s.Leader = &RiverLeader{ID: leader.LeaderID, ElectedAt: leader.ElectedAt, ExpiresAt: leader.ExpiresAt}
	}
	var lastHeard time.Time
	for i, r := range rows {
		s.Relays[i] = RelayProcess{ID: r.ID, Hostname: r.Hostname, PID: int(r.Pid), StartedAt: r.StartedAt,
			HeartbeatAt: r.HeartbeatAt, LastClaimAt: r.LastClaimAt, Alive: r.Alive,
			Leader: leader != nil && leader.LeaderID == r.ID.String()}
		if r.Alive {
			s.Alive++
		}
		if r.LastClaimAt != nil && (s.LastClaimAt == nil || r.LastClaimAt.After(*s.LastClaimAt)) {
			s.LastClaimAt = r.LastClaimAt
		}
		if r.HeartbeatAt.After(lastHeard) {
			lastHeard = r.HeartbeatAt
		}
	}
	// Ages against the database's clock, which wrote the times.
	now := time.Now()
	if len(rows) > 0 {
		now = rows[0].Now
	}
	due := time.Duration(s.OldestDueSeconds * float64(time.Second))
	switch {
	case s.Alive == 0:
		s.State = RelayDown
		s.Reason = "No worker has sent a heartbeat, so nothing is being delivered."
		if !lastHeard.IsZero() {
			s.Reason = fmt.Sprintf("The last heartbeat of any worker was %s ago, so nothing is being delivered.",
				now.Sub(lastHeard).Round(time.Second))
		}
	case s.Due > 0 && due > threshold && (s.LastClaimAt == nil || now.Sub(*s.LastClaimAt) > threshold):
		s.State = RelayStalled
		s.Reason = fmt.Sprintf("A message has been due for %s and no relay has claimed anything for longer than %s.",
			due.Round(time.Second), threshold)
	default:
		s.State = RelayRunning
	}
	return s, nil
}
