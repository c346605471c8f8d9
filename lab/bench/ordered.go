package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// preloadOrdered inserts n pending messages, each the one delivery of its
// own event, as preloadPending does, with event g (1…n) of sequence g % keys:
// its destination is chosen by its sequence (so with a number of endpoints
// that divides keys, each sequence goes to one endpoint), and, when keyed,
// the sequence is its ordering key, an order-id-like UUID text, on the event
// and on its delivery. Unkeyed, the rows are the same but for the key. Each
// row gets its own time t, a microsecond after the previous one's, for its
// event's id (outbox_uuid_v7_at(t): microsecond order), its created_at and
// its due time, so within a key ids and due times follow the sequence, as
// EventEnqueue writes them.
func preloadOrdered(ctx context.Context, pool *pgxpool.Pool, n, keys int, keyed bool) error {
	_, err := pool.Exec(ctx, `
		WITH e AS (SELECT array_agg(id ORDER BY id) AS ids FROM webhook_endpoints),
		src AS MATERIALIZED (
			SELECT g, g % $2::int AS seq, t.at, outbox_uuid_v7_at(t.at) AS id,
			       CASE WHEN $3::bool THEN md5('order-' || (g % $2::int))::uuid::text END AS ordering_key
			FROM (SELECT g, now() - interval '10 minutes' + g * interval '1 microsecond' AS at
			      FROM generate_series(1, $1::int) g) t
		), ev AS (
			INSERT INTO outbox_events (id, type, payload, ordering_key, created_at)
			SELECT src.id, 'order.placed',
			       jsonb_build_object('id', gen_random_uuid(), 'customer_id', 'c-' || g, 'status', 'placed',
			                          'total_cents', 1000, 'created_at', src.at,
			                          'lines', jsonb_build_array(
			                              jsonb_build_object('sku', 'A-1', 'quantity', 1, 'unit_price_cents', 500),
			                              jsonb_build_object('sku', 'B-2', 'quantity', 1, 'unit_price_cents', 500)))::json,
			       src.ordering_key, src.at
			FROM src
		)
		INSERT INTO outbox_messages (id, event_id, type, destination, ordering_key, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(src.id), src.id, 'order.placed', e.ids[1 + src.seq % cardinality(e.ids)],
		       src.ordering_key, src.at, src.at
		FROM e, src`, n, keys, keyed)
	if err != nil {
		return fmt.Errorf("preloading %d pending messages (keyed %v): %w", n, keyed, err)
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE outbox_events, outbox_messages")
	return err
}

// checkSequences verifies that a keyed preload holds what the scenario
// says: within each destination and key, deliveries sorted by their time
// have distinct times and strictly increasing ids, so the claim's order
// (next_attempt_at, id) is the key's sequence. It returns how many keys
// there are.
func checkSequences(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var keys, bad int64
	err := pool.QueryRow(ctx, `
		SELECT count(DISTINCT ordering_key),
		       count(*) FILTER (WHERE prev_id IS NOT NULL AND (prev_id >= id OR prev_at >= next_attempt_at))
		FROM (SELECT ordering_key, id, next_attempt_at,
		             lag(id) OVER w AS prev_id, lag(next_attempt_at) OVER w AS prev_at
		      FROM outbox_messages WHERE ordering_key IS NOT NULL
		      WINDOW w AS (PARTITION BY destination, ordering_key ORDER BY next_attempt_at, id)) s`).Scan(&keys, &bad)
	if err != nil {
		return 0, err
	}
	if bad > 0 {
		return keys, fmt.Errorf("%d deliveries out of their key's sequence in the preload", bad)
	}
	return keys, nil
}

// watchParked samples, every 20 ms until stopped, how many messages are
// parked (pending behind an earlier unfinished message of their key, on the
// ordering index), and returns the most seen at once.
func watchParked(ctx context.Context, pool *pgxpool.Pool) (stop func() int64) {
	done, finished := make(chan struct{}), make(chan struct{})
	var most int64
	go func() {
		defer close(finished)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages
				WHERE ordering_key IS NOT NULL AND status = 'pending' AND parked`).Scan(&n); err == nil {
				most = max(most, n)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		<-finished
		return most
	}
}

// scenarioOrdered drains the same backlog with the real relay twice per
// repetition: every message unkeyed, then every message keyed by one of
// cfg.OrderedKeys sequences. It measures what per-key order costs when it
// holds little back: each key's events are far apart in the backlog, so a
// claim mostly finds the one before already delivered, and pays for
// looking. The most messages parked at once is sampled and reported.
func scenarioOrdered(ctx context.Context, cfg config, rep *report) error {
	e, err := newDrainEnv(ctx, cfg.Endpoints)
	if err != nil {
		return err
	}
	defer e.close()
	n, keys := cfg.OrderedDrain, cfg.OrderedKeys
	type variant struct {
		name  string
		keyed bool
	}
	variants := []variant{{"unkeyed", false}, {"keyed", true}}
	samples, pgPer, selfPer := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	mostParked := map[string]int64{}
	for range cfg.Reps {
		for _, v := range variants {
			if err := resetOutbox(ctx, e.watch); err != nil {
				return err
			}
			if _, err := e.watch.Exec(ctx, "UPDATE webhook_endpoints SET url = $1", e.fast.url); err != nil {
				return err
			}
			if err := preloadOrdered(ctx, e.watch, n, keys, v.keyed); err != nil {
				return err
			}
			if v.keyed {
				got, err := checkSequences(ctx, e.watch)
				if err != nil {
					return fmt.Errorf("ordered drain: %w", err)
				}
				if want := int64(min(keys, n)); got != want {
					return fmt.Errorf("ordered drain: %d distinct keys, want %d", got, want)
				}
			}
			e.fast.reset(true, false)
			s := relaySetup{Config: relay.DefaultConfig(), Transport: httpTransport()}
			parked := watchParked(ctx, e.watch)
			r, cpu, err := withCPU(ctx, e.watch, func() (float64, error) { return relayDrain(ctx, e.db.url, e.watch, n, s) })
			mostParked[v.name] = max(mostParked[v.name], parked())
			if err != nil {
				return fmt.Errorf("ordered drain, %s: %w", v.name, err)
			}
			if _, distinct := e.fast.duplicates(); distinct != int64(n) {
				return fmt.Errorf("ordered drain, %s: the receiver saw %d distinct webhook-ids of %d", v.name, distinct, n)
			}
			samples[v.name] = append(samples[v.name], r)
			pgPer[v.name] = append(pgPer[v.name], cpu.pgPerMsg(n))
			selfPer[v.name] = append(selfPer[v.name], cpu.selfPerMsg(n))
			logf("  %s: %s msgs/s (CPU per message: PostgreSQL %.0f µs, bench %.0f µs; most parked at once %d)",
				v.name, rate(r), cpu.pgPerMsg(n), cpu.selfPerMsg(n), mostParked[v.name])
		}
	}
	unkeyed, keyed := median(samples["unkeyed"]), median(samples["keyed"])
	ratio := keyed / unkeyed

	var b strings.Builder
	fmt.Fprintf(&b, "The same backlog of **%s pending messages over %d endpoints** (each the one delivery of its own event, ~300-byte order payloads, seeded in one statement) drained by the real relay (`relay.New` + `Relay.Start`, `relay.DefaultConfig()`, a 20-connection pool, HTTP to the loopback receiver answering 204 at once, as drain (c) in section 2), "+
		"once with every message **unkeyed** and once with every message **keyed**: %s distinct ordering keys (order-id-like UUID text on the event and its delivery), event *i* of key *i* mod %s, so each key is a sequence of about %d events on one endpoint, as an order's events are. "+
		"Every row has its own time, a microsecond after the previous one, for its event's id (`outbox_uuid_v7_at`), its creation and its due time, so within a key ids and due times follow the sequence, as `EventEnqueue` writes them. "+
		"Medians of %d runs, the two interleaved run by run; the clock starts before the relay starts. "+
		"A keyed claim looks, for each due message, for an earlier unfinished one of its key (on `outbox_messages_ordering_idx`) and parks the message if there is one, until that one is delivered; here a key's previous event is %s messages earlier in the backlog (%s on its endpoint), so it has almost always been delivered: the figure is what per-key order costs when it holds (almost) nothing back. "+
		"The last column is the most messages seen parked at once, sampled every 20 ms during the drains.\n\n",
		commas(int64(n)), cfg.Endpoints, commas(int64(keys)), commas(int64(keys)), max(1, n/keys), cfg.Reps,
		commas(int64(keys)), commas(int64(keys/max(1, cfg.Endpoints))))
	b.WriteString("| messages | msgs/s | vs unkeyed | PostgreSQL CPU per message | bench-process CPU per message | most parked at once |\n|---|---:|---:|---:|---:|---:|\n")
	for _, v := range variants {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.0f µs | %.0f µs | %d |\n", v.name, rate(median(samples[v.name])), median(samples[v.name])/unkeyed,
			median(pgPer[v.name]), median(selfPer[v.name]), mostParked[v.name])
	}
	rep.section("10. Ordered drain", b.String())
	rep.target(fmt.Sprintf("Ordered drain: %s keys vs unkeyed", commas(int64(keys))), "≥ 0.8",
		fmt.Sprintf("%.2f (%s vs %s msgs/s)", ratio, rate(keyed), rate(unkeyed)), ratio >= 0.8)
	rep.results["ordered.ratio"] = ratio
	return nil
}
