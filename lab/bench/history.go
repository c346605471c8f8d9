package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/lab/internal/labsql"
)

// leased is the destination whose lease the claims use, as a deliver job
// holds it.
type leased struct{ destination, token uuid.UUID }

// leaseOne gives the first endpoint a lease for the timed claims.
func leaseOne(ctx context.Context, pool *pgxpool.Pool) (leased, error) {
	l := leased{token: uuid.New()}
	err := pool.QueryRow(ctx, `UPDATE webhook_endpoints SET lease_token = $1
		WHERE id = (SELECT id FROM webhook_endpoints ORDER BY id LIMIT 1) RETURNING id`, l.token).Scan(&l.destination)
	return l, err
}

// claim is the relay's claim statement, read from its query file.
var claim = labsql.MustQuery("outbox", "MessageClaim")

// planGeneric is the statement the relay sends before the claim, in the
// same transaction: the claim runs under a generic plan.
var planGeneric = labsql.MustQuery("outbox", "TransactionPlanGeneric")

// claimArgs are claim's arguments for a batch of 100 from l.
func claimArgs(l leased) []any {
	args, err := claim.Args(map[string]any{"destination": l.destination, "claim_token": l.token,
		"batch_size": 100, "relay_id": uuid.New()})
	if err != nil {
		panic(err) // the query file and this call disagree: a bug, not a condition
	}
	return args
}

// claimOnce times the relay's claim statement (batch 100, one destination)
// in a transaction that is then rolled back, so every sample sees the same
// backlog.
func claimOnce(ctx context.Context, pool *pgxpool.Pool, l leased) (time.Duration, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	return timeClaim(ctx, tx, l)
}

// timeClaim times the relay's claim of 100 messages of l in tx as the relay
// sends it: after TransactionPlanGeneric, in one round trip.
func timeClaim(ctx context.Context, tx pgx.Tx, l leased) (time.Duration, error) {
	start := time.Now()
	n := 0
	b := &pgx.Batch{}
	b.Queue(planGeneric.SQL)
	b.Queue(claim.SQL, claimArgs(l)...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			n++
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, err
	}
	took := time.Since(start)
	if n != 100 {
		return 0, fmt.Errorf("claim took %d rows, want 100", n)
	}
	return took, nil
}

type claimStats struct {
	n             int
	p50, p99, max time.Duration
}

// claimLatency times claims until stop returns true (at least min samples
// unless stop is nil, then exactly samples), one every pace.
func claimLatency(ctx context.Context, pool *pgxpool.Pool, l leased, samples int, pace time.Duration, stop func() bool) (claimStats, error) {
	var lat []time.Duration
	next := time.Now()
	for {
		if stop == nil && len(lat) >= samples {
			break
		}
		if stop != nil && stop() && len(lat) >= 10 {
			break
		}
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
		next = next.Add(pace)
		d, err := claimOnce(ctx, pool, l)
		if err != nil {
			return claimStats{}, err
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	return claimStats{len(lat), percentile(lat, .5), percentile(lat, .99), lat[len(lat)-1]}, nil
}

func explainClaim(ctx context.Context, pool *pgxpool.Pool, l leased) (string, error) {
	var out []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+claim.SQL, claimArgs(l)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				return err
			}
			out = append(out, line)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return errRollback
	})
	if err != nil && err != errRollback {
		return "", err
	}
	return strings.Join(out, "\n"), nil
}

var errRollback = fmt.Errorf("rollback")

// addAttempts gives every delivered row its attempt record, as the relay
// writes it, so the history (and the prune's cascade) is realistic.
func addAttempts(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `INSERT INTO outbox_attempts (message_id, attempt, outcome, started_at, finished_at, status_code)
		SELECT id, 1, 'delivered', delivered_at, delivered_at, 204 FROM outbox_messages WHERE status = 'delivered'`)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE outbox_attempts")
	return err
}

// claimBacklog is a scenario's database with the endpoints, a backlog of
// pending messages spread over them, and the first endpoint leased for
// the timed claims.
type claimBacklog struct {
	db      *database
	pool    *pgxpool.Pool
	l       leased
	backlog int
}

func (c *claimBacklog) close() {
	c.pool.Close()
	_ = c.db.drop()
}

// openClaimBacklog makes a claimBacklog in a database made by open
// (newDatabase, or newMigratedDatabase): 20,000 pending messages (1,000
// for a smoke run) over cfg.Endpoints endpoints.
func openClaimBacklog(ctx context.Context, cfg config, open func(context.Context) (*database, error)) (*claimBacklog, error) {
	db, err := open(ctx)
	if err != nil {
		return nil, err
	}
	c := &claimBacklog{db: db, backlog: 20_000}
	if cfg.Smoke {
		c.backlog = 1_000
	}
	if c.pool, err = db.pool(ctx, 8); err != nil {
		_ = db.drop()
		return nil, err
	}
	if err = addEndpoints(ctx, c.pool, cfg.Endpoints, "http://127.0.0.1:9/hook"); err == nil {
		if err = preloadPending(ctx, c.pool, c.backlog); err == nil {
			c.l, err = leaseOne(ctx, c.pool)
		}
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func scenarioHistory(ctx context.Context, cfg config, rep *report) error {
	c, err := openClaimBacklog(ctx, cfg, newDatabase)
	if err != nil {
		return err
	}
	defer c.close()
	pool, l, backlog := c.pool, c.l, c.backlog
	// Warm the plan cache and the buffers.
	if _, err := claimLatency(ctx, pool, l, 20, 0, nil); err != nil {
		return err
	}
	empty, err := claimLatency(ctx, pool, l, cfg.ClaimSamples, 0, nil)
	if err != nil {
		return err
	}
	explainEmpty, err := explainClaim(ctx, pool, l)
	if err != nil {
		return err
	}
	t := time.Now()
	historyAt := time.Now().Add(-6 * 24 * time.Hour)
	if err := preloadDelivered(ctx, pool, cfg.History, historyAt); err != nil {
		return err
	}
	if err := addAttempts(ctx, pool); err != nil {
		return err
	}
	loadTook := time.Since(t)
	logf("  loaded %d delivered rows in %s", cfg.History, loadTook.Round(time.Second))
	var partitions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions()`).Scan(&partitions); err != nil {
		return err
	}
	if _, err := claimLatency(ctx, pool, l, 20, 0, nil); err != nil {
		return err
	}
	full, err := claimLatency(ctx, pool, l, cfg.ClaimSamples, 0, nil)
	if err != nil {
		return err
	}
	explainFull, err := explainClaim(ctx, pool, l)
	if err != nil {
		return err
	}
	var tableSize, eventsSize, attemptsSize, pendingIdx string
	_ = pool.QueryRow(ctx, `SELECT pg_size_pretty((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox_messages'))),
		pg_size_pretty((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox_events'))),
		pg_size_pretty((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox_attempts'))),
		pg_size_pretty((SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree('outbox_messages_pending_idx')))`).Scan(&tableSize, &eventsSize, &attemptsSize, &pendingIdx)
	logf("  claim p50 %s → %s, p99 %s → %s", ms(empty.p50), ms(full.p50), ms(empty.p99), ms(full.p99))

	// 6. Prune under load: claims paced every 10 ms (a relay claiming
	// 10,000 messages/s), first alone, then while the prune job's statement
	// deletes the history, with its cutoff an hour after it: the history
	// is within the default retention (in a partition a worker keeps), and
	// this is the day its retention has passed it.
	pace := 10 * time.Millisecond
	var (
		pruneDone  = make(chan struct{})
		pruned     int64
		pruneErr   error
		pruneTook  time.Duration
		pruneStart time.Time
		once       sync.Once
	)
	// Baseline first, for as long as a prune of this size is expected to
	// take (measured below; start with a fixed window).
	baseWindow := 15 * time.Second
	if cfg.Smoke {
		baseWindow = 300 * time.Millisecond
	}
	baseEnd := time.Now().Add(baseWindow)
	base, err := claimLatency(ctx, pool, l, 0, pace, func() bool { return time.Now().After(baseEnd) })
	if err != nil {
		return err
	}
	// Prune only PruneRows of the history: the rest is moved inside the
	// retention window first.
	if cfg.PruneRows < cfg.History {
		if _, err := pool.Exec(ctx, `UPDATE outbox_messages SET delivered_at = now() WHERE id IN (
			SELECT id FROM outbox_messages WHERE status = 'delivered' ORDER BY delivered_at DESC LIMIT $1)`, cfg.History-cfg.PruneRows); err != nil {
			return err
		}
	}
	var prunedEvents int64
	go func() {
		pruneStart = time.Now()
		pruned, prunedEvents, pruneErr = labsql.Prune(ctx, pool, historyAt.Add(time.Hour))
		pruneTook = time.Since(pruneStart)
		once.Do(func() { close(pruneDone) })
	}()
	during, err := claimLatency(ctx, pool, l, 0, pace, func() bool {
		select {
		case <-pruneDone:
			return true
		default:
			return false
		}
	})
	<-pruneDone
	if err != nil {
		return err
	}
	if pruneErr != nil {
		return fmt.Errorf("prune: %w", pruneErr)
	}
	if pruned != int64(cfg.PruneRows) {
		return fmt.Errorf("prune: deleted %d delivered rows, not the %d past its cutoff", pruned, cfg.PruneRows)
	}
	logf("  prune %d rows (and %d events) in %s: claim p99 %s → %s", pruned, prunedEvents, pruneTook.Round(time.Millisecond), ms(base.p99), ms(during.p99))

	var b strings.Builder
	fmt.Fprintf(&b, "The relay's claim statement (`MessageClaim`, batch 100, for one of the %d destinations under its lease, as a deliver job runs it: under a generic plan, one round trip) timed on its own, %d times back to back, in a transaction rolled back after each claim so every sample sees the same backlog of %s pending messages; then %s delivered rows (each with its event in `outbox_events` and its `outbox_attempts` record, delivered 6 days ago, within the retention, so in one of the %d partitions a worker keeps at the defaults) are added in bulk (%s) and `VACUUM ANALYZE` runs, as autovacuum would have, and the claim is timed again. "+
		"With the history: `outbox_messages` %s in total, `outbox_events` %s, `outbox_attempts` %s; the partial pending index stays %s.\n\n",
		cfg.Endpoints, cfg.ClaimSamples, commas(int64(backlog)), commas(int64(cfg.History)), partitions, loadTook.Round(time.Second), tableSize, eventsSize, attemptsSize, pendingIdx)
	b.WriteString("| delivered rows retained | claims | p50 | p99 | max |\n|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| 0 | %d | %s | %s | %s |\n", empty.n, msf(empty.p50)+" ms", msf(empty.p99)+" ms", ms(empty.max))
	fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", commas(int64(cfg.History)), full.n, msf(full.p50)+" ms", msf(full.p99)+" ms", ms(full.max))
	fmt.Fprintf(&b, "\nRatio with history / empty: p50 **%.2f**, p99 %.2f.\n\n", float64(full.p50)/float64(empty.p50), float64(full.p99)/float64(empty.p99))
	b.WriteString("`EXPLAIN (ANALYZE, BUFFERS)` of the claim, empty history:\n\n```\n" + explainEmpty + "\n```\n\n")
	fmt.Fprintf(&b, "With %s delivered rows:\n\n```\n%s\n```\n", commas(int64(cfg.History)), explainFull)
	rep.section("4. History does not slow the claim", b.String())

	b.Reset()
	fmt.Fprintf(&b, "Claims (as above) paced one every %s, first for %s alone, then while the prune job's statements (`MessagesPrune`: `DELETE` of 5,000 delivered and 5,000 discarded rows at most, cascading to `outbox_attempts`, repeated until none is left; then `EventsPrune`: the next 5,000 old events from where the last batch stopped, deleting those no message refers to any more, until none is left) delete %s delivered rows and their %s events, its cutoff an hour after them (the day the retention has passed them). The prune took %s (%s rows/s).\n\n",
		pace, baseWindow, commas(pruned), commas(prunedEvents), pruneTook.Round(100*time.Millisecond), rate(float64(pruned)/pruneTook.Seconds()))
	b.WriteString("| | claims | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| without pruning | %d | %s | %s | %s |\n", base.n, ms(base.p50), ms(base.p99), ms(base.max))
	fmt.Fprintf(&b, "| during pruning | %d | %s | %s | %s |\n", during.n, ms(during.p50), ms(during.p99), ms(during.max))
	fmt.Fprintf(&b, "\nRatio during / without: p50 %.2f, p99 **%.2f**.\n", float64(during.p50)/float64(base.p50), float64(during.p99)/float64(base.p99))
	rep.section("6. Prune under load", b.String())

	r50 := float64(full.p50) / float64(empty.p50)
	rep.target(fmt.Sprintf("Claim with %s delivered rows vs empty", commas(int64(cfg.History))), "≤ 1.2× (p50)",
		fmt.Sprintf("p50 %.2f× (%s vs %s), p99 %.2f×", r50, ms(full.p50), ms(empty.p50), float64(full.p99)/float64(empty.p99)), r50 <= 1.2)
	r99 := float64(during.p99) / float64(base.p99)
	rep.target(fmt.Sprintf("Claim p99 while pruning %s rows vs without", commas(pruned)), "≤ 2×",
		fmt.Sprintf("%.2f× (%s vs %s)", r99, ms(during.p99), ms(base.p99)), r99 <= 2)
	return nil
}
