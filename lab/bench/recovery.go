package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

type recoveryRun struct {
	held                int
	recovered, drained  time.Duration
	requests, distinct  int64
	interruptedRecorded int64
}

// recoverOnce runs two relay processes at the defaults against a receiver
// that answers in 500 ms, SIGKILLs the one holding claims, and times how
// long the other takes to deliver what it held, and everything.
func recoverOnce(ctx context.Context, url string, watch *pgxpool.Pool, rc *receiver, n int) (recoveryRun, error) {
	var run recoveryRun
	if err := resetOutbox(ctx, watch); err != nil {
		return run, err
	}
	if _, err := watch.Exec(ctx, "DELETE FROM outbox_relays"); err != nil {
		return run, err
	}
	rc.reset(true, false)
	g, err := startRelays(ctx, url, 2, true)
	if err != nil {
		return run, err
	}
	defer g.stop()
	if err := until(ctx, 30*time.Second, "both relays registered", func() (bool, error) {
		var relays int
		err := watch.QueryRow(ctx, "SELECT count(*) FROM outbox_relays").Scan(&relays)
		return relays == 2, err
	}); err != nil {
		return run, err
	}
	if err := preloadPending(ctx, watch, n); err != nil {
		return run, err
	}
	var pid int
	if err := until(ctx, 30*time.Second, "a relay holding claims", func() (bool, error) {
		err := watch.QueryRow(ctx, `SELECT r.pid FROM outbox_messages m JOIN outbox_relays r ON r.id = m.claimed_by
			WHERE m.status = 'claimed' LIMIT 1`).Scan(&pid)
		return err == nil, nil
	}); err != nil {
		return run, err
	}
	i := slices.IndexFunc(g.procs, func(p *exec.Cmd) bool { return p.Process.Pid == pid })
	if i < 0 {
		return run, fmt.Errorf("claims held by pid %d, not one of the relays", pid)
	}
	if err := g.procs[i].Process.Kill(); err != nil {
		return run, err
	}
	_ = g.procs[i].Wait()
	killed := time.Now()
	var held []uuid.UUID
	rows, err := watch.Query(ctx, "SELECT id FROM outbox_messages WHERE status = 'claimed'")
	if err != nil {
		return run, err
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			return run, err
		}
		held = append(held, id)
	}
	if err := rows.Err(); err != nil {
		return run, err
	}
	run.held = len(held)
	undelivered := func(ids []uuid.UUID) (int, error) {
		var left int
		err := watch.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE status <> 'delivered'
			AND ($1::uuid[] IS NULL OR id = ANY ($1))`, ids).Scan(&left)
		return left, err
	}
	if err := until(ctx, time.Minute, "the dead relay's claims delivered", func() (bool, error) {
		left, err := undelivered(held)
		return left == 0, err
	}); err != nil {
		return run, err
	}
	run.recovered = time.Since(killed)
	if err := until(ctx, time.Minute, "every message delivered", func() (bool, error) {
		left, err := undelivered(nil)
		return left == 0, err
	}); err != nil {
		return run, err
	}
	run.drained = time.Since(killed)
	run.requests, run.distinct = rc.duplicates()
	err = watch.QueryRow(ctx, "SELECT count(*) FROM outbox_attempts WHERE outcome = 'interrupted'").Scan(&run.interruptedRecorded)
	return run, err
}

// secs writes a duration in seconds, to a tenth.
func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// until polls cond every 5 ms until it holds or limit passes.
func until(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s waiting for %s", limit, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// scenarioRecovery measures how soon a SIGKILLed relay's claims are
// delivered by another at the defaults.
func scenarioRecovery(ctx context.Context, cfg config, rep *report) error {
	db, err := newDatabase(ctx)
	if err != nil {
		return err
	}
	defer db.drop() //nolint:errcheck
	watch, err := db.pool(ctx, 4)
	if err != nil {
		return err
	}
	defer watch.Close()
	rc, err := newReceiver(500 * time.Millisecond)
	if err != nil {
		return err
	}
	defer rc.close()
	if err := addEndpoints(ctx, watch, 1, rc.url); err != nil {
		return err
	}
	const n = 40
	var runs []recoveryRun
	for range cfg.RecoveryReps {
		run, err := recoverOnce(ctx, db.url, watch, rc, n)
		if err != nil {
			return err
		}
		logf("  SIGKILL with %d claims held: delivered by the other relay after %s, all after %s; %d requests for %d messages",
			run.held, run.recovered.Round(time.Millisecond), run.drained.Round(time.Millisecond), run.requests, run.distinct)
		runs = append(runs, run)
	}
	def := relay.DefaultConfig()
	var b strings.Builder
	fmt.Fprintf(&b, "Two relay processes (this binary re-executed, `relay.DefaultConfig()`) serve one endpoint that answers in 500 ms; %d messages are preloaded, and the relay holding claims is SIGKILLed with its requests in flight. "+
		"The time is from the kill to the moment the other relay has recorded every message the dead one held as delivered (and every message). The other relay declares it dead once its heartbeat is %s old (`OUTBOX_RELAY_TIMEOUT`), and returns its claims to pending, each recorded as an `interrupted` attempt. %d runs.\n\n",
		n, def.RelayTimeout, len(runs))
	b.WriteString("| run | claims held at the kill | their delivery after the kill | all delivered after the kill | requests / messages |\n|---:|---:|---:|---:|---:|\n")
	var rec []time.Duration
	for i, r := range runs {
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %d / %d |\n", i+1, r.held, secs(r.recovered), secs(r.drained), r.requests, r.distinct)
		rec = append(rec, r.recovered)
	}
	slices.Sort(rec)
	fmt.Fprintf(&b, "\nMedian %s, worst %s. Requests beyond one per message are the ones the dead relay had in flight: the receiver had them, the relay never learned it, and they were sent again with the same `webhook-id`.\n",
		secs(percentile(rec, .5)), secs(rec[len(rec)-1]))
	rep.section("9. Recovery after SIGKILL", b.String())
	rep.target("A SIGKILLed worker's claims delivered by another, defaults", "within 10 s",
		fmt.Sprintf("median %s, worst %s", secs(percentile(rec, .5)), secs(rec[len(rec)-1])), rec[len(rec)-1] <= 10*time.Second)
	return nil
}
