package admin

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two replays of one endpoint at once make one copy of an event, not two:
// the second waits for the first to commit, and then sees its copy
// waiting. Each alone checks for a waiting copy, but neither can see the
// other's before it commits.
func TestConcurrentReplaysOfOneEndpointMakeOneCopy(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	from := time.Now()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, tx, outbox.Event{Type: "order.placed", Data: 1})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	ep := outboxtest.Endpoint(t, pool, nil) // subscribed after the event: nothing waits for it yet
	r := Replay{From: from, To: time.Now().Add(time.Second)}
	// The first replay copies the event and has not committed yet.
	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx) //nolint:errcheck
	res, err := replayBatch(ctx, first, ep, r)
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)

	type result struct {
		res ReplayResult
		err error
	}
	second := make(chan result, 1)
	go func() {
		res, err := adm.ReplayEvents(ctx, ep, r)
		second <- result{res, err}
	}()
	// The second either waits on a lock (until the first commits) or, had
	// it nothing to wait on, ends on its own.
	var ended *result
	require.Eventually(t, func() bool {
		select {
		case r := <-second:
			ended = &r
			return true
		default:
		}
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database())`).Scan(&waiting)
		return assert.NoError(t, err) && waiting
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, first.Commit(ctx))
	if ended == nil {
		r := <-second
		ended = &r
	}
	require.NoError(t, ended.err)
	require.Equal(t, ReplayResult{Read: 1, Replayed: 0}, ended.res, "the second replay finds the first one's copy waiting")
	var copies int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending'`, ep).Scan(&copies))
	require.Equal(t, 1, copies, "one waiting copy of the event for the endpoint")
}

// Discarding what waits for an endpoint settles all of it, however many
// batches that takes, parked messages too, and leaves failed ones waiting
// for a person.
func TestDiscardWaitingSettlesEveryBatch(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	ep := outboxtest.Endpoint(t, pool, nil)
	const n = 2*discardBatch + 7
	outboxtest.Seed(t, pool, ep, n, "")
	keyed := outboxtest.Seed(t, pool, ep, 3, "order-1")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET parked = true WHERE id = ANY ($1)`, keyed[1:])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', attempts = 1, failed_at = now() WHERE id = $1`, keyed[0])
	require.NoError(t, err)

	// A budget spent during the first batch: that batch, then a stop.
	discarded, finished, err := adm.DiscardWaiting(ctx, ep, time.Nanosecond)
	require.NoError(t, err)
	require.False(t, finished)
	require.EqualValues(t, discardBatch, discarded, "one whole batch, not a batch cut short")
	more, finished, err := adm.DiscardWaiting(ctx, ep, 0)
	require.NoError(t, err)
	require.True(t, finished)
	require.EqualValues(t, n+2, discarded+more, "every pending message, parked ones too")
	var pending, failed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed')
		FROM outbox_messages WHERE destination = $1`, ep).Scan(&pending, &failed))
	require.Zero(t, pending)
	require.Equal(t, 1, failed, "a failed message waits for a retry or a skip")
}

// A window of time bounds what Messages reads, not only what it returns:
// messages are listed in event order, their ids begin with the event's
// time, and From and To are a range of the primary key. Filtered on
// created_at instead, a search for a quiet endpoint's messages of one hour
// walked the whole history newest first, looking for 50 rows that were not
// there (1.7 s with 1.5 million rows).
func TestMessagesReadsOnlyTheWindow(t *testing.T) {
	t.Parallel()
	pool, trace := dbtest.TracedPool(t)
	ctx := context.Background()
	busy, quiet := outboxtest.Endpoint(t, pool, nil), outboxtest.Endpoint(t, pool, nil)
	// Two days of delivered history for the busy endpoint, one event every
	// 0.864 s, and 5 events of the quiet one 3 hours ago.
	history := func(dest uuid.UUID, n int, first, step string) {
		_, err := pool.Exec(ctx, `
			WITH ev AS (
				INSERT INTO outbox_events (id, type, payload, created_at)
				SELECT outbox_uuid_v7_at(s.at), 'order.placed', '{"total":1}', s.at
				FROM (SELECT now() - $3::interval - g * $4::interval AS at FROM generate_series(1, $2::int) g) s
				RETURNING id, type, created_at
			)
			INSERT INTO outbox_messages (id, event_id, type, destination, status, delivered_at, next_attempt_at, created_at)
			SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, $1, 'delivered', ev.created_at, ev.created_at, ev.created_at
			FROM ev`, dest, n, first, step)
		require.NoError(t, err)
	}
	history(busy, 200_000, "0", "864 milliseconds")
	history(quiet, 5, "3 hours", "1 second")
	_, err := pool.Exec(ctx, `ANALYZE outbox_messages`)
	require.NoError(t, err)
	var pages int
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(c.relpages)::int FROM pg_partition_tree('outbox_messages') p JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf`).Scan(&pages))

	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	from, to := time.Now().Add(-4*time.Hour), time.Now().Add(-2*time.Hour)
	var msgs []Message
	var next *uuid.UUID
	sql, args := trace.One(t, func() (err error) {
		msgs, next, err = adm.Messages(ctx, MessageFilter{Destination: &quiet, CreatedFrom: &from, CreatedTo: &to})
		return err
	})
	require.Len(t, msgs, 5)
	require.Nil(t, next)
	var plan []string
	require.ErrorIs(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		plan = dbtest.PlanLines(t, tx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		return dbtest.ErrRollback
	}), dbtest.ErrRollback)
	t.Logf("%s", strings.Join(plan, "\n"))
	var hit, read int
	for _, l := range plan {
		if _, after, ok := strings.Cut(l, "Buffers: shared hit="); ok {
			// The first is the root's: the statement's whole reading.
			fmt.Sscanf(after, "%d read=%d", &hit, &read)
			break
		}
	}
	require.Positive(t, hit+read)
	require.Less(t, hit+read, pages/5,
		"a window of 2 hours reads about that much of the 48 hours of history (%d pages), not all of it", pages)
}

// A paused endpoint keeps when and why it was paused: changing its URL or
// types, rotating its secret or pausing it again moves neither. StateSince
// was the endpoint's last update, and a person's pause of an endpoint a
// 410 had paused replaced the receiver's reason with theirs.
func TestAPausedEndpointKeepsWhenAndWhyItWasPaused(t *testing.T) {
	t.Parallel()
	pool, lease := dbtest.Pool(t), uuid.New()
	dest := outboxtest.Endpoint(t, pool, &lease)
	ctx := context.Background()
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	_, err := outboxdb.New(pool).DestinationSettle(ctx, outboxdb.DestinationSettleParams{
		ID: dest, LeaseToken: lease, Url: outboxtest.EndpointURL, Health: outbox.HealthHealthy, Gone: true})
	require.NoError(t, err)
	gone, err := adm.Endpoint(ctx, dest)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthPaused, gone.State)
	require.Equal(t, "receiver answered 410 Gone", gone.StateReason)
	require.NotNil(t, gone.StateSince)

	_, err = adm.UpdateEndpoint(ctx, dest, EndpointChange{EventTypes: []string{"order.placed", "order.cancelled"}})
	require.NoError(t, err)
	_, err = adm.RotateSecret(ctx, dest, time.Hour)
	require.NoError(t, err)
	_, err = adm.SetEndpointEnabled(ctx, dest, false)
	require.NoError(t, err)
	still, err := adm.Endpoint(ctx, dest)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthPaused, still.State)
	require.Equal(t, gone.StateSince, still.StateSince, "paused since the 410")
	require.Equal(t, gone.StateReason, still.StateReason, "paused because of the 410")

	// Resumed, then paused by a person: a new pause, with its own time and
	// reason.
	_, err = adm.SetEndpointEnabled(ctx, dest, true)
	require.NoError(t, err)
	again, err := adm.SetEndpointEnabled(ctx, dest, false)
	require.NoError(t, err)
	require.Equal(t, "disabled by an operator", again.StateReason)
	require.True(t, again.StateSince.After(*gone.StateSince), "%v after %v", again.StateSince, gone.StateSince)
}

// Enabling an endpoint that is enabled and healthy leaves a receiver's
// Retry-After in force; only an endpoint backing off is probed at once.
// Before, the wait the receiver asked for was cut short.
func TestEnablingAThrottledEndpointKeepsItsRetryAfter(t *testing.T) {
	t.Parallel()
	pool, lease := dbtest.Pool(t), uuid.New()
	dest := outboxtest.Endpoint(t, pool, &lease)
	ctx := context.Background()
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	until := time.Now().Add(time.Hour)
	_, err := outboxdb.New(pool).DestinationSettle(ctx, outboxdb.DestinationSettleParams{
		ID: dest, LeaseToken: lease, Url: outboxtest.EndpointURL, Health: outbox.HealthHealthy, BackoffUntil: &until})
	require.NoError(t, err)
	ep, err := adm.SetEndpointEnabled(ctx, dest, true)
	require.NoError(t, err)
	require.NotNil(t, ep.ThrottledUntil, "still throttled")
	require.WithinDuration(t, until, *ep.ThrottledUntil, time.Millisecond)
}

// "Retry all failed" of a deleted endpoint requeues nothing, as a retry of
// one of its messages does not: what its deletion left failed (for the
// orphan job to discard) is settled, not to be sent again.
func TestRetryFailedForADeletedEndpointRequeuesNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ep := outboxtest.Endpoint(t, pool, nil)
	ctx := context.Background()
	ids := outboxtest.Seed(t, pool, ep, 3, "")
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET status = 'failed', attempts = 8, failed_at = now() WHERE id = ANY ($1)`, ids)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, ep)
	require.NoError(t, err)
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	n, err := adm.RetryFailedForEndpoint(ctx, ep)
	require.ErrorIs(t, err, ErrNotFound)
	require.Zero(t, n)
	var failed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status = 'failed'`).Scan(&failed))
	require.Equal(t, 3, failed, "left for the orphan job to discard")
}

// The deliveries of one event are a range of the primary key (their ids
// share its first 64 bits), and so is a page older than a cursor: the list
// reads that range under any plan. It did under the custom plans of a
// statement's first executions, but once PostgreSQL's plan cache switched
// the statement to its generic plan (after five runs, when the list's other
// filters had made custom plans look dearer: a rare type, say), each range
// sat behind "$n IS NULL OR" and was a filter: the list, and the ops page's
// search for an event id, read every message of the window (all of them
// without one: 0.6 s at 1,000,000), and a page deep in the history every
// message newer than it. The same for the page just newer than a cursor.
func TestMessageListReadsOnlyItsRangeUnderAnyPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds a million messages")
	}
	t.Parallel()
	pool, trace := dbtest.TracedPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, event_types)
		SELECT 'http://127.0.0.1:9/' || g, 'whsec_AAAA', '{order.placed}' FROM generate_series(1, 2) g;
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(s.at), 'order.placed', '{"total":1}', s.at
			FROM (SELECT now() - g * interval '1200 milliseconds' AS at FROM generate_series(1, 500000) g) s
			RETURNING id, type, created_at
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, delivered_at, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, e.id, 'delivered', 1, ev.created_at, ev.created_at, ev.created_at
		FROM ev CROSS JOIN webhook_endpoints e;
		ANALYZE outbox_events, outbox_messages;`)
	require.NoError(t, err)
	var event, first uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT event_id, id FROM outbox_messages ORDER BY id OFFSET 500000 LIMIT 1`).Scan(&event, &first))
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))

	for name, f := range map[string]MessageFilter{
		"newest first":          {Event: &event},
		"newer than the cursor": {Event: &event, After: &first, Limit: 2},
		"older than the cursor": {Before: &first, Limit: 2},
	} {
		var msgs []Message
		custom := trace.Explain(t, pool, func(pgx.Tx) (err error) {
			msgs, _, err = adm.Messages(ctx, f)
			return err
		})
		require.NotEmpty(t, msgs, name)
		for _, m := range msgs {
			if f.Event != nil {
				require.Equal(t, event, m.EventID, name)
			} else {
				require.Less(t, m.ID.String(), first.String(), name)
			}
		}
		generic := trace.ExplainGeneric(t, pool)
		for kind, plan := range map[string]string{"custom": custom, "generic": generic} {
			require.Less(t, dbtest.RootBuffers(t, plan), 100,
				"%s, %s plan: a range of the primary key, a few pages, not the million messages:\n%s", name, kind, plan)
		}
	}
}

// A dry run reads as much of its range per call as a replay's call scans
// (ten times its batch), however wide the range, and says where to count
// on from; the calls together count the whole range. It counted the whole
// range in one statement (0.4 s with 2,000,000 events; forty at once made
// a POST /orders beside them take 11 s). A call that goes on from a cursor,
// a dry run's or a replay's, starts its scan at the cursor under any plan:
// behind "$n IS NULL OR" a generic plan read the range from its start to
// the cursor again for every batch.
func TestReplayDryRunReadsABoundedShareOfTheRangePerCall(t *testing.T) {
	t.Parallel()
	pool, trace := dbtest.TracedPool(t)
	ctx := context.Background()
	ep := outboxtest.Endpoint(t, pool, nil)
	const n = 200_000
	_, err := pool.Exec(ctx, `
		INSERT INTO outbox_events (id, type, payload, created_at)
		SELECT outbox_uuid_v7_at(s.at), 'order.placed', '{"total":1}', s.at
		FROM (SELECT now() - g * interval '100 milliseconds' AS at FROM generate_series(1, $1::int) g) s`, n)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE outbox_events`)
	require.NoError(t, err)
	var pages int
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(c.relpages)::int FROM pg_partition_tree('outbox_events') p JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf`).Scan(&pages))
	adm := New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	r := Replay{From: time.Now().Add(-24 * time.Hour), To: time.Now()}

	first, err := adm.ReplayCount(ctx, ep, r)
	require.NoError(t, err)
	// The count's statement as ReplayCount runs it (its endpoint lookup
	// is another).
	plan := trace.Explain(t, pool, func(tx pgx.Tx) error {
		_, err := outboxdb.New(tx).EndpointReplayCount(ctx, outboxdb.EndpointReplayCountParams{Endpoint: ep,
			FromTime: r.From, ToTime: r.To, ScanLimit: replayScan * MaxReplayBatch})
		return err
	})
	require.Equal(t, int64(replayScan*MaxReplayBatch), first.Events, "the first call counts the events it may look at")
	require.NotNil(t, first.Next, "and says where to count on")
	require.Less(t, dbtest.RootBuffers(t, plan), pages/5, "one call reads its share of the range, not the %d pages of its events:\n%s", pages, plan)

	total, calls := first.Events, 1
	for d := first; d.Next != nil; calls++ {
		r.After = d.Next
		d, err = adm.ReplayCount(ctx, ep, r)
		require.NoError(t, err)
		total += d.Events
	}
	require.EqualValues(t, n, total, "the calls together count every event of the range once")
	require.Equal(t, n/(replayScan*MaxReplayBatch)+1, calls, "each call counts its share, the last finds the end")

	// From a cursor three quarters into the range, the count and the
	// replay read their share from the cursor on, under both plans.
	var cursor uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox_events ORDER BY id OFFSET $1 LIMIT 1`, n*3/4).Scan(&cursor))
	for name, run := range map[string]func(tx pgx.Tx) error{
		"dry run": func(tx pgx.Tx) error {
			_, err := outboxdb.New(tx).EndpointReplayCount(ctx, outboxdb.EndpointReplayCountParams{Endpoint: ep,
				FromTime: r.From, ToTime: r.To, After: &cursor, ScanLimit: replayScan * MaxReplayBatch})
			return err
		},
		"replay": func(tx pgx.Tx) error {
			_, err := outboxdb.New(tx).EndpointReplay(ctx, outboxdb.EndpointReplayParams{Endpoint: ep,
				FromTime: r.From, ToTime: r.To, After: &cursor, BatchSize: MaxReplayBatch, ScanLimit: replayScan * MaxReplayBatch})
			return err
		},
	} {
		custom := trace.Explain(t, pool, run)
		generic := trace.ExplainGeneric(t, pool)
		for kind, plan := range map[string]string{"custom": custom, "generic": generic} {
			require.Less(t, eventsSkipped(t, plan), 1000,
				"%s from a cursor, %s plan: its share of the range from the cursor, not the range up to it:\n%s", name, kind, plan)
			if name == "dry run" {
				require.Less(t, dbtest.RootBuffers(t, plan), pages/5, "%s, %s plan:\n%s", name, kind, plan)
			}
		}
	}
}

// eventsSkipped sums the events a plan's scans of outbox_events read and
// dropped by a filter: the lines under each scan's node, up to the next
// node.
func eventsSkipped(t *testing.T, plan string) int {
	t.Helper()
	n, inScan := 0, false
	for _, l := range strings.Split(plan, "\n") {
		if strings.Contains(l, "->") || strings.Contains(l, "(cost=") {
			inScan = strings.Contains(l, " on outbox_events ")
			continue
		}
		if _, after, ok := strings.Cut(l, "Rows Removed by Filter: "); ok && inScan {
			x, err := strconv.Atoi(strings.TrimSpace(after))
			require.NoError(t, err, l)
			n += x
		}
	}
	return n
}
