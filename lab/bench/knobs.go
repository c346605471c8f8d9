package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/outboxkit/orders/internal/outbox/relay"
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
	def := relay.DefaultConfig()
	cfgv := func(label string, f func(*relay.Config)) knobValue {
		return knobValue{label, func(s *relaySetup) { f(&s.Config) }}
	}
	return []knob{
		{"DestinationConcurrency (`OUTBOX_DESTINATION_CONCURRENCY`)", "requests in flight per destination; with the no-op transport, how many messages one claim takes", []knobValue{
			cfgv("4", func(c *relay.Config) { c.DestinationConcurrency = 4 }),
			cfgv(fmt.Sprintf("%d (default)", def.DestinationConcurrency), func(*relay.Config) {}),
			cfgv("64", func(c *relay.Config) { c.DestinationConcurrency = 64 }),
			cfgv("256", func(c *relay.Config) { c.DestinationConcurrency = 256 }),
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
	fmt.Fprintf(&b, "Each setting changed alone from `relay.DefaultConfig()`; drain of %s pending messages over %d endpoints with the no-op transport (the relay's own cost), median of %d run(s), runs of one knob interleaved. "+
		"DestinationConcurrency with a receiver that takes time is measured in section 2 (d); PollInterval, which matters only when the relay is idle, in section 3.\n\n",
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
				s := relaySetup{Config: relay.DefaultConfig(), Transport: noopTransport{}}
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
