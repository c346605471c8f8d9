package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/lab/internal/labsql"
)

// placeRequest is the order every write-path client places: two lines, as in
// the measurement of the write path in docs/PERFORMANCE.md.
func placeRequest(i int64) orders.PlaceRequest {
	return orders.PlaceRequest{CustomerID: fmt.Sprintf("c-%d", i%1000), Lines: []orders.Line{
		{SKU: "A-1", Quantity: 2, UnitPriceCents: 500},
		{SKU: "B-2", Quantity: 1, UnitPriceCents: 1250},
	}}
}

// placeFunc places order number i, as one transaction.
type placeFunc func(ctx context.Context, i int64) error

// placeLoop places orders with clients goroutines for d and returns orders/s.
func placeLoop(ctx context.Context, place placeFunc, clients int, d time.Duration) (float64, error) {
	var n atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := place(ctx, n.Load()); err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, &err)
					}
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return 0, *p
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// The order transaction's statements, read from the product's query files:
// the same order and lines inserts orders.Service.Place runs, and the
// outbox row outbox.Enqueue writes.
var (
	orderInsert      = labsql.MustQuery("orders", "OrderInsert")
	orderLinesInsert = labsql.MustQuery("orders", "OrderLinesInsert")
	messageEnqueue   = labsql.MustQuery("outbox", "MessageEnqueue")
)

// sqlPlacer places orders with the product's own statements, in one
// transaction: the order and its lines, then (withOutbox) the outbox row,
// then (withNotify) a pg_notify, the wake-up a LISTENing relay would need.
// It is the baseline the outbox is measured against: the same transaction
// with and without the outbox row, and nothing else different.
func sqlPlacer(pool *pgxpool.Pool, withOutbox, withNotify bool) placeFunc {
	return func(ctx context.Context, i int64) error {
		req := placeRequest(i)
		var total int64
		var skus []string
		var quantities []int32
		var prices []int64
		for _, l := range req.Lines {
			total += int64(l.Quantity) * l.UnitPriceCents
			skus, quantities, prices = append(skus, l.SKU), append(quantities, int32(l.Quantity)), append(prices, l.UnitPriceCents)
		}
		id := uuid.New()
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			args, err := orderInsert.Args(map[string]any{"id": id, "customer_id": req.CustomerID, "total_cents": total,
				"idempotency_key": nil, "request_hash": nil})
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, orderInsert.SQL, args...); err != nil {
				return err
			}
			if args, err = orderLinesInsert.Args(map[string]any{"order_id": id, "skus": skus, "quantities": quantities,
				"unit_prices_cents": prices}); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, orderLinesInsert.SQL, args...); err != nil {
				return err
			}
			if !withOutbox {
				return nil
			}
			payload, err := json.Marshal(map[string]any{"id": id, "customer_id": req.CustomerID, "status": "placed",
				"total_cents": total, "lines": req.Lines, "created_at": time.Now()})
			if err != nil {
				return err
			}
			if args, err = messageEnqueue.Args(map[string]any{"type": orders.EventPlaced, "payload": payload,
				"trace_context": nil}); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, messageEnqueue.SQL, args...); err != nil {
				return err
			}
			if withNotify {
				_, err = tx.Exec(ctx, "SELECT pg_notify('outbox_bench', '')")
			}
			return err
		})
	}
}

type writeVariant struct {
	name  string
	place func(pool *pgxpool.Pool) placeFunc
}

var writeVariants = []writeVariant{
	{"without outbox", func(pool *pgxpool.Pool) placeFunc { return sqlPlacer(pool, false, false) }},
	{"with outbox", func(pool *pgxpool.Pool) placeFunc { return sqlPlacer(pool, true, false) }},
	{"outbox + NOTIFY in tx", func(pool *pgxpool.Pool) placeFunc { return sqlPlacer(pool, true, true) }},
	{"orders.Service.Place", func(pool *pgxpool.Pool) placeFunc {
		svc := orders.NewService(pool, discard)
		return func(ctx context.Context, i int64) error { _, _, err := svc.Place(ctx, placeRequest(i)); return err }
	}},
}

// writeResult holds the medians by clients and variant.
type writeResult map[int]map[string]float64

// measureWrite runs every variant at every client count, interleaved
// (A, B, C, A, B, C, …) so drift on a noisy machine hits all alike, and
// returns the medians.
func measureWrite(ctx context.Context, pool *pgxpool.Pool, clientCounts []int, reps int, d time.Duration) (writeResult, error) {
	res := writeResult{}
	for _, clients := range clientCounts {
		samples := map[string][]float64{}
		// Warm up the pool's connections and the caches.
		if _, err := placeLoop(ctx, writeVariants[1].place(pool), clients, d/3); err != nil {
			return nil, err
		}
		for range reps {
			for _, v := range writeVariants {
				tps, err := placeLoop(ctx, v.place(pool), clients, d)
				if err != nil {
					return nil, fmt.Errorf("%s, %d clients: %w", v.name, clients, err)
				}
				samples[v.name] = append(samples[v.name], tps)
			}
		}
		res[clients] = map[string]float64{}
		for name, xs := range samples {
			res[clients][name] = median(xs)
		}
	}
	return res, nil
}

func scenarioWrite(ctx context.Context, cfg config, rep *report) error {
	db, err := newDatabase(ctx)
	if err != nil {
		return err
	}
	defer db.drop() //nolint:errcheck
	pool, err := db.pool(ctx, 16)
	if err != nil {
		return err
	}
	defer pool.Close()
	// One subscribed endpoint: each order writes one outbox row. No relay
	// runs, so the measurement is the write path alone.
	if err := addEndpoints(ctx, pool, 1, "http://127.0.0.1:9/hook"); err != nil {
		return err
	}
	clientCounts := []int{1, 8}
	// The ratio is a target close to the machine's noise: more repetitions
	// than the other scenarios steady its median.
	reps := max(cfg.Reps, 5)
	if cfg.Smoke {
		reps = cfg.Reps
	}
	res, err := measureWrite(ctx, pool, clientCounts, reps, cfg.WriteDuration)
	if err != nil {
		return err
	}

	var b strings.Builder
	fmt.Fprintf(&b, "Order transactions per second: the order row and its 2 lines in one transaction, with the product's own statements (`OrderInsert`, `OrderLinesInsert` read from `db/queries/orders`), "+
		"then the same with the outbox row for the one subscribed endpoint (`MessageEnqueue`, as `outbox.Enqueue` runs it), then with a `pg_notify` too (the wake-up a LISTENing relay would need; the service does **not** do this). "+
		"The last column is the product's own path, `orders.Service.Place` (the same transaction with the outbox row, plus its validation, JSON encoding and log line). "+
		"Each cell is the median of %d runs of %s; the variants are interleaved run by run.\n\n",
		reps, cfg.WriteDuration)
	b.WriteString("| clients | without outbox | with outbox | ratio | outbox + NOTIFY in tx | ratio NOTIFY / outbox | orders.Service.Place |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range clientCounts {
		r := res[c]
		fmt.Fprintf(&b, "| %d | %s | %s | **%.2f** | %s | %.2f | %s |\n", c, rate(r["without outbox"]), rate(r["with outbox"]),
			r["with outbox"]/r["without outbox"], rate(r["outbox + NOTIFY in tx"]), r["outbox + NOTIFY in tx"]/r["with outbox"],
			rate(r["orders.Service.Place"]))
	}
	rep.section("1. Write path", b.String())
	r8 := res[8]
	ratio := r8["with outbox"] / r8["without outbox"]
	rep.target("Write path: with/without outbox at 8 clients", "≥ 0.75", fmt.Sprintf("%.2f (%s vs %s tx/s)", ratio, rate(r8["with outbox"]), rate(r8["without outbox"])), ratio >= 0.75)
	rep.results["write.ratio8"] = ratio
	return nil
}
