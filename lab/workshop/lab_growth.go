package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/lab/internal/labsql"
)

// claim is the relay's claim statement, read from the product's query file:
// one destination's due messages, for the deliver job holding its lease.
var claim = labsql.MustQuery("outbox", "MessageClaim")

// plan is what EXPLAIN (ANALYZE, BUFFERS) says about one claim.
type plan struct {
	scan    string // how the pending rows are found
	buffers int64  // shared buffers the scan for pending rows hit or read
	ms      float64
}

func (p plan) String() string {
	return fmt.Sprintf("%s, %d buffers, %.2f ms", p.scan, p.buffers, p.ms)
}

// explainClaim runs the claim under EXPLAIN ANALYZE in a transaction that
// is rolled back, so nothing is claimed (nor the lease it takes first, as a
// deliver job would). withoutIndex drops the partial index inside that
// transaction first (DDL is transactional in PostgreSQL), to show what the
// claim would cost without it.
func (l *lab) explainClaim(withoutIndex bool) (plan, error) {
	var out plan
	err := pgx.BeginFunc(l.ctx, l.pool, func(tx pgx.Tx) error {
		var dest, token uuid.UUID
		if err := tx.QueryRow(l.ctx, `UPDATE webhook_endpoints SET lease_token = gen_random_uuid()
			WHERE id = (SELECT id FROM webhook_endpoints ORDER BY created_at LIMIT 1)
			RETURNING id, lease_token`).Scan(&dest, &token); err != nil {
			return fmt.Errorf("leasing the endpoint: %w", err)
		}
		args, err := claim.Args(map[string]any{"destination": dest, "claim_token": token, "batch_size": 100, "relay_id": uuid.New()})
		if err != nil {
			return err
		}
		if withoutIndex {
			if _, err := tx.Exec(l.ctx, "DROP INDEX outbox_messages_pending_idx"); err != nil {
				return err
			}
		}
		var raw []byte
		if err := tx.QueryRow(l.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+claim.SQL, args...).Scan(&raw); err != nil {
			return fmt.Errorf("explaining the claim: %w", err)
		}
		var doc []struct {
			Plan          planNode `json:"Plan"`
			ExecutionTime float64  `json:"Execution Time"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil || len(doc) == 0 {
			return fmt.Errorf("reading the plan: %v", err)
		}
		out.ms = doc[0].ExecutionTime
		out.scan = "?"
		// The claim locks the endpoint (its lease) and the due messages:
		// the messages' lock is the one that finds the pending rows.
		if leaf := doc[0].Plan.lockedScanOf("outbox_messages"); leaf != nil {
			out.scan = leaf.NodeType
			out.buffers = leaf.SharedHit + leaf.SharedRead
			if leaf.IndexName != "" {
				// Plain, bitmap or index-only: the planner picks by the
				// statistics of the moment; what matters is the index,
				// named as its table's (each partition has its own:
				// outbox_messages_legacy_pending_idx is the legacy
				// partition's outbox_messages_pending_idx).
				out.scan = "Index Scan using " + partitionIndex.ReplaceAllString(leaf.IndexName, "outbox_messages_")
			}
		}
		return errRollback
	})
	if err != nil && err != errRollback {
		return plan{}, err
	}
	return out, nil
}

var errRollback = fmt.Errorf("rollback")

// partitionIndex is the start of the name of a partition's index of
// outbox_messages.
var partitionIndex = regexp.MustCompile(`^outbox_messages_(legacy|p\d{8}t\d{4})_`)

type planNode struct {
	NodeType     string     `json:"Node Type"`
	IndexName    string     `json:"Index Name"`
	RelationName string     `json:"Relation Name"`
	SharedHit    int64      `json:"Shared Hit Blocks"`
	SharedRead   int64      `json:"Shared Read Blocks"`
	Plans        []planNode `json:"Plans"`
}

// lockedScanOf returns the scan under a LockRows node that reads table:
// the innermost node of its first children, when one of them reads the
// table (a bitmap scan's index scan names no table, its heap scan does).
func (n *planNode) lockedScanOf(table string) *planNode {
	if n.NodeType == "LockRows" {
		leaf, reads := n, false
		for len(leaf.Plans) > 0 {
			leaf = &leaf.Plans[0]
			// The table, or one of its partitions (outbox_messages_legacy).
			reads = reads || leaf.RelationName == table || strings.HasPrefix(leaf.RelationName, table+"_")
		}
		if reads {
			return leaf
		}
	}
	for i := range n.Plans {
		if f := n.Plans[i].lockedScanOf(table); f != nil {
			return f
		}
	}
	return nil
}

// outboxSize is the size of the outbox: its messages and their events.
func (l *lab) outboxSize() (int64, error) {
	return l.count(`SELECT (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox_messages'))::bigint
		+ (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox_events'))::bigint`)
}

// addHistory inserts n delivered messages, delivered age ago, each the one
// delivery of its own event, with a payload the size of an order event. Ids
// are as EventEnqueue writes them: the event's a UUIDv7 of its time, its
// delivery's sharing the event's first 64 bits.
func (l *lab) addHistory(n int, age time.Duration) error {
	_, err := l.pool.Exec(l.ctx, `
WITH src AS MATERIALIZED (
    SELECT g, t.at, outbox_uuid_v7_at(t.at) AS id
    FROM (SELECT g, now() - make_interval(secs => $2) + g * interval '1 microsecond' AS at
          FROM generate_series(1, $1) g) t
), ev AS (
    INSERT INTO outbox_events (id, type, payload, created_at)
    SELECT src.id, 'order.placed',
           jsonb_build_object('id', gen_random_uuid(), 'customer_id', 'customer-' || g, 'status', 'placed',
                              'total_cents', 1000, 'lines', jsonb_build_array(jsonb_build_object('sku', 'A-1', 'quantity', 2, 'unit_price_cents', 500)))::json,
           src.at
    FROM src
)
INSERT INTO outbox_messages (id, event_id, type, destination, status, attempts, next_attempt_at, delivered_at, created_at)
SELECT outbox_uuid_sibling(src.id), src.id, 'order.placed', gen_random_uuid(), 'delivered', 1, src.at, src.at, src.at
FROM src`, n, age.Seconds())
	if err != nil {
		return fmt.Errorf("adding history: %w", err)
	}
	_, err = l.pool.Exec(l.ctx, "ANALYZE outbox_events, outbox_messages")
	return err
}

func lab8(l *lab) (*Report, error) {
	history := l.opts.History
	if history == 0 {
		history = 100_000
	}
	const pending = 100
	retention := 7 * 24 * time.Hour // the default OUTBOX_RETENTION
	old := history * 9 / 10
	recent := history - old

	l.p.Step("%d pending messages for one endpoint, no history yet", pending)
	ep, err := l.endpoint("http://127.0.0.1:9/hook", "order.placed")
	if err != nil {
		return nil, err
	}
	if _, err := l.pool.Exec(l.ctx, `
		WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(t.at), 'order.placed', json_build_object('n', t.g), t.at
			FROM (SELECT g, clock_timestamp() AS at FROM generate_series(1, $1) g) t
			RETURNING id, type, created_at
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(ev.id), ev.id, ev.type, $2, ev.created_at, ev.created_at FROM ev`, pending, ep.ID); err != nil {
		return nil, err
	}
	if _, err := l.pool.Exec(l.ctx, "ANALYZE outbox_events, outbox_messages"); err != nil {
		return nil, err
	}
	before, err := l.explainClaim(false)
	if err != nil {
		return nil, err
	}
	sizeBefore, err := l.outboxSize()
	if err != nil {
		return nil, err
	}

	l.p.Step("adding %d delivered rows of history (%d older than the 7-day retention)", history, old)
	if err := l.addHistory(old, retention+24*time.Hour); err != nil {
		return nil, err
	}
	if err := l.addHistory(recent, time.Hour); err != nil {
		return nil, err
	}
	grown, err := l.explainClaim(false)
	if err != nil {
		return nil, err
	}
	noIndex, err := l.explainClaim(true)
	if err != nil {
		return nil, err
	}
	sizeGrown, err := l.outboxSize()
	if err != nil {
		return nil, err
	}

	l.p.Step("running the prune (the relay's prune job's statements: settled rows past the retention, then their events, in batches), then VACUUM")
	pruned, prunedEvents, err := labsql.Prune(l.ctx, l.pool, time.Now().Add(-retention))
	if err != nil {
		return nil, err
	}
	// Autovacuum does this on its own schedule; the lab does not wait for it.
	if _, err := l.pool.Exec(l.ctx, "VACUUM (ANALYZE) outbox_events, outbox_messages"); err != nil {
		return nil, err
	}
	after, err := l.explainClaim(false)
	if err != nil {
		return nil, err
	}
	sizePruned, err := l.outboxSize()
	if err != nil {
		return nil, err
	}
	kept, err := l.count("SELECT count(*) FROM outbox_messages WHERE status = 'delivered'")
	if err != nil {
		return nil, err
	}

	l.p.Step("another week: %d more delivered rows, into the space the prune freed", old)
	if err := l.addHistory(old, time.Hour); err != nil {
		return nil, err
	}
	sizeRefilled, err := l.outboxSize()
	if err != nil {
		return nil, err
	}

	r := newReport("Lab 8: growth and pruning")
	r.Section("the claim (EXPLAIN ANALYZE, batch of 100): how it finds the pending rows, and what that reads")
	r.Text("plan.before", "with no history", before.scan, fmt.Sprintf("%d buffers, %.2f ms", before.buffers, before.ms))
	r.Text("plan.grown", fmt.Sprintf("with %d delivered rows", history), grown.scan, fmt.Sprintf("%d buffers, %.2f ms", grown.buffers, grown.ms))
	r.Text("plan.noindex", "same, without the partial index", noIndex.scan, fmt.Sprintf("%d buffers, %.2f ms", noIndex.buffers, noIndex.ms))
	r.Text("plan.after", "after the prune", after.scan, fmt.Sprintf("%d buffers, %.2f ms", after.buffers, after.ms))
	r.Counts["buffers.before"], r.Counts["buffers.grown"], r.Counts["buffers.noindex"] = before.buffers, grown.buffers, noIndex.buffers
	r.Section("the tables (pg_total_relation_size of outbox_messages and outbox_events, their partitions summed: heap and indexes)")
	r.Text("size.before", "with no history", kb(sizeBefore), "")
	r.Text("size.grown", fmt.Sprintf("with %d delivered rows", history), kb(sizeGrown), "")
	r.Count("pruned", "pruned", pruned, "delivered before the retention")
	r.Count("events_pruned", "events pruned", prunedEvents, "written before the retention, no message left")
	r.Count("kept", "kept", kept, "delivered within the retention: the audit record")
	r.Text("size.pruned", "after the prune and VACUUM", kb(sizePruned), "the file keeps its size; its free space is reusable")
	r.Text("size.refilled", fmt.Sprintf("after %d more rows", old), kb(sizeRefilled), fmt.Sprintf("without the prune: about %s", kb(sizeGrown+(sizeGrown-sizeBefore)*int64(old)/int64(history))))
	r.Counts["size.before"], r.Counts["size.grown"], r.Counts["size.pruned"], r.Counts["size.refilled"] = sizeBefore, sizeGrown, sizePruned, sizeRefilled
	r.Verdict("The claim reads the partial index on pending rows: its cost follows the backlog, not the history.")
	r.Verdict("Pruning keeps the table's size bounded; PostgreSQL reuses the freed space rather than shrinking the file.")
	const idx = "using outbox_messages_pending_idx"
	if !strings.Contains(grown.scan, idx) || !strings.Contains(after.scan, idx) ||
		strings.Contains(noIndex.scan, idx) || noIndex.buffers <= 10*grown.buffers || pruned != int64(old) || prunedEvents != int64(old) ||
		sizeRefilled >= sizeGrown+(sizeGrown-sizeBefore)*int64(old)/int64(history) {
		return r, fmt.Errorf("%w: lab 8's invariants do not hold", errInvariant)
	}
	return r, nil
}
