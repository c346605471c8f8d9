package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders"
)

// placeRequest is the order every write-path client places: two lines, as in
// the measurement of the write path in docs/PERFORMANCE.md.
func placeRequest(i int64) orders.PlaceRequest {
	return orders.PlaceRequest{CustomerID: fmt.Sprintf("c-%d", i%1000), Lines: []orders.Line{
		{SKU: "A-1", Quantity: 2, UnitPriceCents: 500},
		{SKU: "B-2", Quantity: 1, UnitPriceCents: 1250},
	}}
}

// placeLoop places orders with clients goroutines for d and returns orders/s.
func placeLoop(ctx context.Context, svc *orders.Service, clients int, d time.Duration) (float64, error) {
	var n atomic.Int64
	var firstErr atomic.Pointer[error]
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, _, err := svc.Place(ctx, placeRequest(n.Load())); err != nil {
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

type writeVariant struct {
	name string
	opts []orders.Option
}

var writeVariants = []writeVariant{
	{"without outbox", []orders.Option{orders.WithoutOutbox()}},
	{"with outbox", nil},
	{"outbox + NOTIFY in tx", []orders.Option{orders.WithNotify("outbox_bench")}},
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
		if _, err := placeLoop(ctx, orders.NewService(pool, discard), clients, d/3); err != nil {
			return nil, err
		}
		for range reps {
			for _, v := range writeVariants {
				tps, err := placeLoop(ctx, orders.NewService(pool, discard, v.opts...), clients, d)
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
	fmt.Fprintf(&b, "Order transactions per second through `orders.Service.Place` (order row + 2 lines, and one outbox row for the one subscribed endpoint). "+
		"Each cell is the median of %d runs of %s; the three variants are interleaved run by run. "+
		"`without outbox` is `orders.NewService(pool, logger, orders.WithoutOutbox())`; the NOTIFY column adds `pg_notify` in the same transaction (`orders.WithNotify`), which the service does **not** do by default.\n\n",
		reps, cfg.WriteDuration)
	b.WriteString("| clients | without outbox | with outbox | ratio | outbox + NOTIFY in tx | ratio NOTIFY / outbox |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range clientCounts {
		r := res[c]
		fmt.Fprintf(&b, "| %d | %s | %s | **%.2f** | %s | %.2f |\n", c, rate(r["without outbox"]), rate(r["with outbox"]),
			r["with outbox"]/r["without outbox"], rate(r["outbox + NOTIFY in tx"]), r["outbox + NOTIFY in tx"]/r["with outbox"])
	}
	rep.section("1. Write path", b.String())
	r8 := res[8]
	ratio := r8["with outbox"] / r8["without outbox"]
	rep.target("Write path: with/without outbox at 8 clients", "≥ 0.75", fmt.Sprintf("%.2f (%s vs %s tx/s)", ratio, rate(r8["with outbox"]), rate(r8["without outbox"])), ratio >= 0.75)
	rep.results["write.ratio8"] = ratio
	return nil
}
