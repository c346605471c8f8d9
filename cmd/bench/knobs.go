package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/outboxkit/orders/internal/outbox"
)

type knob struct {
	name, doc string
	values    []knobValue
}

type knobValue struct {
	label string
	set   func(*relaySetup)
}

func knobs() []knob {
	def := outbox.DefaultRelayConfig()
	cfgv := func(label string, f func(*outbox.RelayConfig)) knobValue {
		return knobValue{label, func(s *relaySetup) { f(&s.Config) }}
	}
	return []knob{
		{"BatchSize (`OUTBOX_BATCH_SIZE`)", "messages per claim statement", []knobValue{
			cfgv("100", func(c *outbox.RelayConfig) { c.BatchSize = 100 }),
			cfgv(fmt.Sprintf("%d (default)", def.BatchSize), func(*outbox.RelayConfig) {}),
			cfgv("2000", func(c *outbox.RelayConfig) { c.BatchSize = 2000 }),
		}},
		{"DeliverBatch (`OUTBOX_DELIVER_BATCH`)", "messages per deliver job (one River job, one load, one recording transaction)", []knobValue{
			cfgv("10", func(c *outbox.RelayConfig) { c.DeliverBatch = 10 }),
			cfgv("50", func(c *outbox.RelayConfig) { c.DeliverBatch = 50 }),
			cfgv("200", func(c *outbox.RelayConfig) { c.DeliverBatch = 200 }),
			cfgv("400", func(c *outbox.RelayConfig) { c.DeliverBatch = 400 }),
		}},
		{"DeliverWorkers (`OUTBOX_DELIVER_WORKERS`)", "deliver jobs one process runs at once", []knobValue{
			cfgv("10", func(c *outbox.RelayConfig) { c.DeliverWorkers = 10 }),
			cfgv("25", func(c *outbox.RelayConfig) { c.DeliverWorkers = 25 }),
			cfgv("50", func(c *outbox.RelayConfig) { c.DeliverWorkers = 50 }),
			cfgv("100", func(c *outbox.RelayConfig) { c.DeliverWorkers = 100 }),
		}},
		{"River FetchCooldown (set in `Relay.NewRiverClient`, 10 ms)", "minimum time between two fetches of a River producer", []knobValue{
			{"1 ms", func(s *relaySetup) { s.FetchCooldown = time.Millisecond }},
			{"10 ms (relay's)", func(s *relaySetup) { s.FetchCooldown = 10 * time.Millisecond }},
			{"100 ms (River's default)", func(s *relaySetup) { s.FetchCooldown = 100 * time.Millisecond }},
		}},
		{"Pool size (`cmd/worker`: 20)", "connections in the relay's pgx pool, shared by River and the relay", []knobValue{
			{"5", func(s *relaySetup) { s.PoolSize = 5 }},
			{"10", func(s *relaySetup) { s.PoolSize = 10 }},
			{"20", func(s *relaySetup) { s.PoolSize = 20 }},
			{"40", func(s *relaySetup) { s.PoolSize = 40 }},
		}},
	}
}

// scenarioKnobs drains a backlog with the no-op transport, changing one
// setting at a time from the defaults.
func scenarioKnobs(ctx context.Context, cfg config, rep *report) error {
	e, err := newDrainEnv(ctx, cfg.Endpoints)
	if err != nil {
		return err
	}
	defer e.close()
	only := os.Getenv("BENCH_KNOBS") // for exploring one knob
	var b strings.Builder
	fmt.Fprintf(&b, "Each setting changed alone from `DefaultRelayConfig()`; drain of %s pending messages over %d endpoints with the no-op transport (the relay's own cost), median of %d run(s), runs of one knob interleaved. "+
		"DeliverConcurrency, which matters only when receivers take time, is measured in section 2 (d); PollInterval, which matters only when the relay is idle, in section 3.\n\n",
		commas(int64(cfg.KnobDrain)), cfg.Endpoints, cfg.Reps)
	for _, k := range knobs() {
		if only != "" && !strings.Contains(k.name, only) {
			continue
		}
		if cfg.Smoke {
			k.values = k.values[:1]
		}
		samples := make([][]float64, len(k.values))
		cpus := make([][]float64, len(k.values))
		for range cfg.Reps {
			for i, v := range k.values {
				s := relaySetup{Config: outbox.DefaultRelayConfig(), Transport: noopTransport{}}
				v.set(&s)
				if err := e.prepare(ctx, cfg.KnobDrain, e.fast.url); err != nil {
					return err
				}
				r, cpu, err := withCPU(ctx, e.watch, func() (float64, error) { return relayDrain(ctx, e.db.url, e.watch, cfg.KnobDrain, s) })
				if err != nil {
					return fmt.Errorf("%s = %s: %w", k.name, v.label, err)
				}
				total := cpu.pgPerMsg(cfg.KnobDrain) + cpu.selfPerMsg(cfg.KnobDrain)
				logf("  %s = %s: %s msgs/s, %.0f µs CPU/msg", k.name, v.label, rate(r), total)
				samples[i] = append(samples[i], r)
				cpus[i] = append(cpus[i], total)
			}
		}
		fmt.Fprintf(&b, "**%s**: %s.\n\n| value | msgs/s | CPU per message (PostgreSQL + relay) |\n|---|---:|---:|\n", k.name, k.doc)
		for i, v := range k.values {
			fmt.Fprintf(&b, "| %s | %s | %.0f µs |\n", v.label, rate(median(samples[i])), median(cpus[i]))
		}
		b.WriteString("\n")
	}
	rep.section("7. Knobs", b.String())
	return nil
}
