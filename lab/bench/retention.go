package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/lab/internal/labsql"
)

// The statements of a partition's drop, read from the product's query
// files: its lock timeout, the events' prune lock (no replay meanwhile),
// and the check that nothing in the partition must be kept.
var (
	partitionLockDrop = labsql.MustQuery("outbox", "PartitionLockDrop")
	eventsLockPrune   = labsql.MustQuery("outbox", "EventsLockPrune")
	partitionHeld     = labsql.MustQuery("outbox", "PartitionHeld")
)

// retentionRun is one way of removing one day of history, measured.
type retentionRun struct {
	method string
	rows   int64
	took   time.Duration
	// locked is how long a drop held the parents' locks (none for a
	// delete, whose batches lock their rows only).
	locked      time.Duration
	wal         int64
	base, under claimStats
	// writes are orders placed per second by one client, without and
	// while the history is removed.
	writesBase, writesUnder float64
}

// scenarioRetention removes a day of delivered history (its events,
// messages and attempts) both ways the prune job can: the batched DELETE
// it runs in a partition something keeps, and the drop of the whole
// partition it runs otherwise; each at two sizes, side by side in one run,
// while claims and order transactions go on beside it.
func scenarioRetention(ctx context.Context, cfg config, rep *report) error {
	c, err := openClaimBacklog(ctx, cfg, newDatabase)
	if err != nil {
		return err
	}
	defer c.close()
	pool, l, backlog := c.pool, c.l, c.backlog
	window := 5 * time.Second
	if cfg.Smoke {
		window = 300 * time.Millisecond
	}
	past, kept, err := pastDay(ctx, pool)
	if err != nil {
		return err
	}
	// Each size and method is measured cfg.Reps times, the four
	// interleaved within a repetition: a single run's p99 of some 500
	// claims moves by ±30 % from noise alone (a drop of 250,000 rows read
	// 0.84× and one of 1,000,000 1.42× in one run).
	type cell struct {
		method string
		rows   int
	}
	var cells []cell
	for _, rows := range []int{cfg.PruneRows / 4, cfg.PruneRows} {
		for _, method := range []string{"delete", "drop"} {
			cells = append(cells, cell{method, rows})
		}
	}
	runs := map[cell][]retentionRun{}
	for rep := range cfg.Reps {
		for _, c := range cells {
			r, err := retainOnce(ctx, pool, l, c.method, c.rows, window, past)
			if err != nil {
				return fmt.Errorf("%s of %d rows: %w", c.method, c.rows, err)
			}
			logf("  %d/%d %s %d rows: %s (parents locked %s), WAL %s, claim p99 %s → %s, writes %.0f → %.0f/s", rep+1, cfg.Reps, c.method, r.rows,
				r.took.Round(time.Millisecond), msf(r.locked), bytesHuman(r.wal), ms(r.base.p99), ms(r.under.p99), r.writesBase, r.writesUnder)
			runs[c] = append(runs[c], r)
		}
	}
	// med is the median over a cell's runs of what f reads from each.
	med := func(c cell, f func(retentionRun) float64) float64 {
		var xs []float64
		for _, r := range runs[c] {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	took := func(r retentionRun) float64 { return float64(r.took) }
	locked := func(r retentionRun) float64 { return float64(r.locked) }
	wal := func(r retentionRun) float64 { return float64(r.wal) }
	p99Ratio := func(r retentionRun) float64 { return float64(r.under.p99) / float64(r.base.p99) }
	writeRatio := func(r retentionRun) float64 { return r.writesUnder / r.writesBase }

	few, steady, err := claimByPartitions(ctx, cfg)
	if err != nil {
		return err
	}

	var b strings.Builder
	fmt.Fprintf(&b, "What each partition costs: the claim (as in section 4, %d times back to back, rolled back, %s pending) in a database as the migrations leave it (%d partitions) and in one with those a worker keeps at the defaults (%d), alternating three times: p50 %s against %s (**%.2f×**), p99 %s against %s. Every statement on the outbox tables opens each partition, and the claim reads the pending index of each.\n\n",
		cfg.ClaimSamples, commas(int64(backlog)), few.partitions, steady.partitions, ms(steady.p50), ms(few.p50), float64(steady.p50)/float64(few.p50), ms(steady.p99), ms(few.p99))
	fmt.Fprintf(&b, "A day of delivered history (each message with its event in `outbox_events` and its attempt in `outbox_attempts`, all written in the day before the oldest partition a worker keeps at the defaults, in a day's partition of its own: past the retention, the next the prune job drops; the database has the %d partitions such a worker keeps besides) is removed both ways the prune job removes history: "+
		"**delete**, the batched `DELETE` it runs in a partition that something (a pending or failed message) keeps (`MessagesPrune`, 5,000 rows a statement with their attempts, then `EventsPrune`), and **drop**, what it runs otherwise: the day's partition of the three tables detached under the parents' locks (`PartitionLockDrop`, `EventsLockPrune`, `LOCK TABLE`, `PartitionHeld` asked again, `DETACH PARTITION`), then dropped (`DROP TABLE`, whose removal of the files takes time that grows with them, without the parents' locks). "+
		"Each at two sizes, %d run(s) of each, the four interleaved within a repetition, in one run of the suite. Beside it, for %s before, for at least %s from its start and for %s after it ended: claims of one destination (as above, paced one every 10 ms, %s pending) and one client placing orders back to back (the product's order transaction, `EventEnqueue` included). The *without* figures are the means of the windows before and after, which cancels the claims' drift over a run (each claim is rolled back, leaving dead row versions behind). WAL is `pg_current_wal_lsn()` at the start and at the end of the removal (the orders placed beside it meanwhile included). Each row is one run; the medians follow.\n\n",
		kept, cfg.Reps, window, window, window, commas(int64(backlog)))
	b.WriteString("| method | rows | took | parents locked | WAL written | claim p99 without → while | ratio | orders/s without → while | ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range cells {
		for _, r := range runs[c] {
			locked := "—"
			if r.method == "drop" {
				locked = msf(r.locked) + " ms"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s → %s | %.2f | %.0f → %.0f | %.2f |\n", r.method, commas(r.rows), r.took.Round(time.Millisecond),
				locked, bytesHuman(r.wal), ms(r.base.p99), ms(r.under.p99), p99Ratio(r), r.writesBase, r.writesUnder, writeRatio(r))
		}
	}
	smallDelete, smallDrop, bigDelete, bigDrop := cells[0], cells[1], cells[2], cells[3]
	b.WriteString("\nMedians:\n\n| method | rows | took | parents locked | WAL written | claim p99 while / without | orders/s while / without |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range cells {
		parents := "—"
		if c.method == "drop" {
			parents = msf(time.Duration(med(c, locked))) + " ms"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | **%.2f** | %.2f |\n", c.method, commas(runs[c][0].rows), time.Duration(med(c, took)).Round(time.Millisecond),
			parents, bytesHuman(int64(med(c, wal))), med(c, p99Ratio), med(c, writeRatio))
	}
	fmt.Fprintf(&b, "\nFour times the rows: the delete took %.1f× as long and wrote %.1f× the WAL; the drop held the parents' locks %.1f× as long, took %.1f× as long in all (the files' removal), and wrote %.1f× the WAL (the orders beside it, mostly).\n",
		med(bigDelete, took)/med(smallDelete, took), med(bigDelete, wal)/max(med(smallDelete, wal), 1),
		med(bigDrop, locked)/med(smallDrop, locked), med(bigDrop, took)/med(smallDrop, took), med(bigDrop, wal)/max(med(smallDrop, wal), 1))
	rep.section("Retention: dropping a day's partition against deleting it", b.String())

	growth := med(bigDrop, locked) / med(smallDrop, locked)
	rep.target(fmt.Sprintf("Drop of a day's partition, %s rows vs %s: the parents' locks", commas(int64(bigDrop.rows)), commas(int64(smallDrop.rows))), "O(1): ≤ 2× as long for 4× the rows",
		fmt.Sprintf("%.2f× (medians %s vs %s ms; in all, the files' removal included, %.1f×; the delete %.1f×)", growth, msf(time.Duration(med(bigDrop, locked))), msf(time.Duration(med(smallDrop, locked))),
			med(bigDrop, took)/med(smallDrop, took), med(bigDelete, took)/med(smallDelete, took)), growth <= 2)
	r99 := med(bigDrop, p99Ratio)
	rep.target("Claim p99 while a partition is dropped vs without", "≤ 1.2×",
		fmt.Sprintf("%.2f× (median of %d; runs %s; while deleting the same rows %.2f×)", r99, len(runs[bigDrop]), ratioRange(runs[bigDrop], p99Ratio),
			med(bigDelete, p99Ratio)), r99 <= 1.2)
	return nil
}

// ratioRange is the lowest and highest of f over runs, as "a–b".
func ratioRange(runs []retentionRun, f func(retentionRun) float64) string {
	lo, hi := f(runs[0]), f(runs[0])
	for _, r := range runs[1:] {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	return fmt.Sprintf("%.2f–%.2f", lo, hi)
}

// partitionedClaims is the claim's latency in a database of so many
// partitions.
type partitionedClaims struct {
	partitions int
	p50, p99   time.Duration
}

// claimByPartitions times the claim in a database as migrated and in one
// with those a worker keeps at the defaults, alternating three times, and
// returns the medians of each's p50 and p99.
func claimByPartitions(ctx context.Context, cfg config) (few, steady partitionedClaims, err error) {
	type side struct {
		*claimBacklog
		partitions int
		p50, p99   []float64
	}
	var sides [2]*side
	for i, open := range []func(context.Context) (*database, error){newMigratedDatabase, newDatabase} {
		c, err := openClaimBacklog(ctx, cfg, open)
		if err != nil {
			return few, steady, err
		}
		defer c.close()
		s := &side{claimBacklog: c}
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions()`).Scan(&s.partitions); err != nil {
			return few, steady, err
		}
		if _, err := claimLatency(ctx, c.pool, c.l, 20, 0, nil); err != nil { // warm
			return few, steady, err
		}
		sides[i] = s
	}
	for range 3 {
		for _, s := range sides {
			st, err := claimLatency(ctx, s.pool, s.l, cfg.ClaimSamples, 0, nil)
			if err != nil {
				return few, steady, err
			}
			s.p50, s.p99 = append(s.p50, float64(st.p50)), append(s.p99, float64(st.p99))
		}
	}
	out := func(s *side) partitionedClaims {
		return partitionedClaims{s.partitions, time.Duration(median(s.p50)), time.Duration(median(s.p99))}
	}
	return out(sides[0]), out(sides[1]), nil
}

// pastDay makes a day's partition before the oldest of those a worker
// keeps (steadyPartitions): past the retention, the partition the prune
// job drops next. It returns its start, and how many partitions there were
// before it.
func pastDay(ctx context.Context, pool *pgxpool.Pool) (time.Time, int, error) {
	var oldest time.Time
	var kept int
	if err := pool.QueryRow(ctx, `SELECT min(outbox_uuid_time(lo)), count(*) FROM outbox_partitions()`).Scan(&oldest, &kept); err != nil {
		return oldest, 0, err
	}
	lo := oldest.Add(-24 * time.Hour)
	if _, err := pool.Exec(ctx, `SELECT outbox_partition_create($1, $2)`, lo, oldest); err != nil {
		return lo, 0, fmt.Errorf("making the day past the retention: %w", err)
	}
	return lo, kept, nil
}

// retainOnce loads rows of delivered history into the day's partition
// starting at past, measures claims and writes for window, then removes
// the history by method while measuring them again for as long as it
// takes, and at least window, then for window again after it.
func retainOnce(ctx context.Context, pool *pgxpool.Pool, l leased, method string, rows int, window time.Duration, past time.Time) (retentionRun, error) {
	r := retentionRun{method: method}
	if err := preloadDelivered(ctx, pool, rows, past.Add(time.Hour)); err != nil {
		return r, err
	}
	if err := addAttempts(ctx, pool); err != nil {
		return r, err
	}
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return r, err
	}
	place := sqlPlacer(pool, batched)
	var placed atomic.Int64
	measure := func(stop func() bool) (claimStats, float64, error) {
		start, before := time.Now(), placed.Load()
		done := make(chan error, 1)
		writeCtx, cancel := context.WithCancel(ctx)
		go func() {
			for i := int64(0); writeCtx.Err() == nil; i++ {
				if err := place(writeCtx, i); err != nil && writeCtx.Err() == nil {
					done <- err
					return
				}
				placed.Add(1)
			}
			done <- nil
		}()
		s, err := claimLatency(ctx, pool, l, 0, 10*time.Millisecond, stop)
		cancel()
		if werr := <-done; err == nil {
			err = werr
		}
		return s, float64(placed.Load()-before) / time.Since(start).Seconds(), err
	}
	baseEnd := time.Now().Add(window)
	var err error
	if r.base, r.writesBase, err = measure(func() bool { return time.Now().After(baseEnd) }); err != nil {
		return r, err
	}

	var walBefore string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&walBefore); err != nil {
		return r, err
	}
	var partition dayPartition
	if method == "drop" {
		if partition, err = findDay(ctx, pool, past.Add(time.Hour)); err != nil {
			return r, err
		}
	}
	finished := make(chan error, 1)
	start := time.Now()
	go func() {
		var err error
		switch method {
		case "delete":
			r.rows, _, err = labsql.Prune(ctx, pool, time.Now().Add(-7*24*time.Hour))
		case "drop":
			r.locked, err = dropDay(ctx, pool, partition, time.Now().Add(-7*24*time.Hour))
			r.rows = partition.messages
		}
		r.took = time.Since(start)
		if err == nil {
			// The WAL from its start to its end: the orders placed
			// beside it in that time are in it too.
			err = pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - $1::pg_lsn`, walBefore).Scan(&r.wal)
		}
		finished <- err
	}()
	var retainErr error
	ended := false
	underEnd := time.Now().Add(window)
	r.under, r.writesUnder, err = measure(func() bool {
		if !ended {
			select {
			case retainErr = <-finished:
				ended = true
			default:
			}
		}
		return ended && time.Now().After(underEnd)
	})
	if !ended {
		retainErr = <-finished
	}
	if err != nil {
		return r, err
	}
	if retainErr != nil {
		return r, retainErr
	}
	// The baseline is the mean of a window before and one after: the
	// claims' latency drifts over a run (each rolled-back claim leaves
	// dead row versions behind), and a baseline taken before only would
	// count that drift against the removal.
	afterEnd := time.Now().Add(window)
	after, writesAfter, err := measure(func() bool { return time.Now().After(afterEnd) })
	if err != nil {
		return r, err
	}
	r.base = claimStats{n: r.base.n + after.n, p50: (r.base.p50 + after.p50) / 2, p99: (r.base.p99 + after.p99) / 2, max: max(r.base.max, after.max)}
	r.writesBase = (r.writesBase + writesAfter) / 2
	if method == "drop" {
		// Made again, empty, for the next run.
		if _, err := pool.Exec(ctx, `SELECT outbox_partition_create($1, $2)`, partition.loAt, partition.hiAt); err != nil {
			return r, err
		}
	}
	return r, nil
}

// dayPartition is the partition of the three tables holding one day: its
// suffix, its bounds, and the messages it holds.
type dayPartition struct {
	suffix     string
	lo, hi     uuid.UUID
	loAt, hiAt time.Time
	messages   int64
}

// findDay finds the partition holding the time at.
func findDay(ctx context.Context, pool *pgxpool.Pool, at time.Time) (dayPartition, error) {
	var p dayPartition
	if err := pool.QueryRow(ctx, `SELECT suffix, lo, hi, outbox_uuid_time(lo), outbox_uuid_time(hi)
		FROM outbox_partitions() WHERE lo <= outbox_uuid_at($1) AND outbox_uuid_at($1) < hi`, at).Scan(&p.suffix, &p.lo, &p.hi, &p.loAt, &p.hiAt); err != nil {
		return p, fmt.Errorf("finding the partition of %s: %w", at, err)
	}
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{"outbox_messages_" + p.suffix}.Sanitize()).Scan(&p.messages)
	return p, err
}

// dropDay drops partition p of the three tables with the statements the
// prune job drops one with: detached under the parents' locks, then
// dropped; trying again a second later when the locks were not had within
// the lock timeout, five times at most (internal/outbox/relay:
// dropPartition). It returns how long the parents were locked.
func dropDay(ctx context.Context, pool *pgxpool.Pool, p dayPartition, cutoff time.Time) (time.Duration, error) {
	for try := 1; ; try++ {
		locked, err := dropDayOnce(ctx, pool, p, cutoff)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" && try < 5 {
			time.Sleep(time.Second)
			continue
		}
		return locked, err
	}
}

func dropDayOnce(ctx context.Context, pool *pgxpool.Pool, p dayPartition, cutoff time.Time) (locked time.Duration, err error) {
	var lockedAt time.Time
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, partitionLockDrop.SQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, eventsLockPrune.SQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE ONLY outbox_events, outbox_messages, outbox_attempts IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		lockedAt = time.Now()
		args, err := partitionHeld.Args(map[string]any{"lo": p.lo, "hi": p.hi, "settled_before": cutoff})
		if err != nil {
			return err
		}
		var held string
		if err := tx.QueryRow(ctx, partitionHeld.SQL, args...).Scan(&held); err != nil {
			return err
		}
		if held != "" {
			return fmt.Errorf("partition %s held by %s", p.suffix, held)
		}
		for _, t := range []string{"outbox_events", "outbox_messages", "outbox_attempts"} {
			if _, err := tx.Exec(ctx, "ALTER TABLE "+t+" DETACH PARTITION "+pgx.Identifier{t + "_" + p.suffix}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	locked = time.Since(lockedAt) // the parents' locks, from LOCK TABLE to the commit
	_, err = pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{"outbox_attempts_" + p.suffix}.Sanitize()+", "+
		pgx.Identifier{"outbox_messages_" + p.suffix}.Sanitize()+", "+pgx.Identifier{"outbox_events_" + p.suffix}.Sanitize())
	return locked, err
}

// bytesHuman writes n bytes as a person reads them.
func bytesHuman(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
