// Command bench is the outbox's performance suite: each scenario of
// PERFORMANCE.md (beside it) measured side by side in one run, against the local
// PostgreSQL, on fresh databases it creates (dbtest.Create) and drops.
//
//	go run ./lab/bench                 # the full suite (≈25 min), writes lab/bench/PERFORMANCE.md
//	go run ./lab/bench -smoke -out -   # every scenario at tiny size (CI runs this via go test)
//	go run ./lab/bench -only drain,latency
//	go run ./lab/bench -only endpoints -out -   # 10,000 endpoints (≈3 min)
//
// The server is TEST_DATABASE_URL, else DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/postgres. Only loopback receivers are
// ever targeted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"
)

type config struct {
	Smoke bool
	Only  []string
	Out   string
	Reps  int

	WriteDuration time.Duration

	Endpoints  int
	Drain      int
	SlowDrain  int
	SlowWarmup time.Duration
	SlowWindow time.Duration
	KnobDrain  int
	Knobs      bool

	OrderedDrain int
	OrderedKeys  int

	BrokerDrain int

	Backlog       int
	BacklogWindow time.Duration

	LatencyRates    []int
	LatencyDuration time.Duration
	IdleWindow      time.Duration

	History      int
	ClaimSamples int
	PruneRows    int

	Relays     []int
	RelayProcs bool
	ScaleDrain int
	ScaleReps  int

	IsolationRate     int
	IsolationDuration time.Duration
	RecoveryReps      int

	ManyEndpoints int
	DownBacklog   int
	EndpointsRate int

	CPUProfile string

	// Soak, when set, runs the soak for this long instead of the suite.
	Soak     time.Duration
	SoakRate int
	SoakOut  string
	SoakAV   bool

	command string
}

var scenarios = []struct {
	name string
	run  func(context.Context, config, *report) error
}{
	{"write", scenarioWrite},
	{"drain", scenarioDrain},
	{"latency", scenarioLatency},
	{"history", scenarioHistory},
	{"retention", scenarioRetention},
	{"scaleout", scenarioScaleOut},
	{"knobs", scenarioKnobs},
	{"isolation", scenarioIsolation},
	{"recovery", scenarioRecovery},
	{"ordered", scenarioOrdered},
	{"brokers", scenarioBrokers},
	{"backlog", scenarioBacklog},
	{"endpoints", scenarioEndpoints},
}

func defaultConfig() config {
	return config{
		Out: "lab/bench/PERFORMANCE.md", Reps: 3,
		WriteDuration: 3 * time.Second,
		Endpoints:     4, Drain: 200_000, SlowDrain: 150_000, SlowWarmup: 2 * time.Second, SlowWindow: 5 * time.Second,
		KnobDrain: 50_000, Knobs: true,
		OrderedDrain: 50_000, OrderedKeys: 10_000,
		BrokerDrain: 20_000,
		Backlog:     1_000_000, BacklogWindow: 10 * time.Second,
		LatencyRates: []int{200, 1000}, LatencyDuration: 10 * time.Second, IdleWindow: 5 * time.Second,
		History: 1_000_000, ClaimSamples: 500, PruneRows: 1_000_000,
		Relays: []int{1, 2, 4}, RelayProcs: true, ScaleDrain: 200_000, ScaleReps: 5,
		IsolationRate: 50, IsolationDuration: 20 * time.Second, RecoveryReps: 3,
		ManyEndpoints: 10_000, DownBacklog: 3, EndpointsRate: 50,
	}
}

// smokeConfig shrinks every scenario so the whole suite runs in seconds: it
// proves the suite works, not how fast anything is.
func smokeConfig(c config) config {
	c.Smoke, c.Reps = true, 1
	c.WriteDuration = 300 * time.Millisecond
	c.Endpoints, c.Drain, c.SlowDrain, c.SlowWarmup, c.SlowWindow = 2, 2_000, 30_000, time.Second, 500*time.Millisecond
	c.KnobDrain = 1_000
	c.OrderedDrain, c.OrderedKeys = 2_000, 500
	c.BrokerDrain = 500
	c.Backlog, c.BacklogWindow = 2_000, 500*time.Millisecond
	c.LatencyRates, c.LatencyDuration, c.IdleWindow = []int{50}, time.Second, 300*time.Millisecond
	c.History, c.ClaimSamples, c.PruneRows = 10_000, 20, 10_000
	c.Relays, c.ScaleDrain, c.ScaleReps = []int{1, 2}, 2_000, 1
	c.IsolationDuration, c.RecoveryReps = time.Second, 1
	c.ManyEndpoints, c.DownBacklog, c.EndpointsRate = 200, 1, 20
	return c
}

func main() {
	if os.Getenv(childEnv) != "" {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "bench relay:", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := run
	if cfg.Soak > 0 {
		run = func(ctx context.Context, cfg config, log io.Writer) error {
			return runSoak(ctx, soakConfig{Duration: cfg.Soak, Rate: cfg.SoakRate, Out: cfg.SoakOut, Autovacuum: cfg.SoakAV}, log)
		}
	}
	if err := run(ctx, cfg, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	c := defaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	smoke := fs.Bool("smoke", false, "every scenario at tiny size (seconds); for CI")
	only := fs.String("only", "", "comma-separated scenarios to run: "+scenarioNames())
	fs.StringVar(&c.Out, "out", c.Out, "Markdown report to write; - for stdout")
	fs.IntVar(&c.Reps, "reps", c.Reps, "repetitions per measurement (medians are reported)")
	fs.DurationVar(&c.WriteDuration, "write-duration", c.WriteDuration, "write path: length of one measurement")
	fs.IntVar(&c.Endpoints, "endpoints", c.Endpoints, "drain: endpoints the backlog is spread over")
	fs.IntVar(&c.Drain, "drain", c.Drain, "drain: pending messages preloaded")
	fs.IntVar(&c.SlowDrain, "slow-drain", c.SlowDrain, "drain (d): pending messages preloaded for the 20 ms receiver")
	fs.DurationVar(&c.SlowWindow, "slow-window", c.SlowWindow, "drain (d): measurement window")
	fs.IntVar(&c.KnobDrain, "knob-drain", c.KnobDrain, "knobs: pending messages per drain")
	fs.BoolVar(&c.Knobs, "knobs", c.Knobs, "run the knob study")
	fs.IntVar(&c.OrderedDrain, "ordered-drain", c.OrderedDrain, "ordered: pending messages preloaded, drained unkeyed and keyed")
	fs.IntVar(&c.OrderedKeys, "ordered-keys", c.OrderedKeys, "ordered: distinct ordering keys of the keyed backlog (message i has key i mod this)")
	fs.IntVar(&c.BrokerDrain, "broker-drain", c.BrokerDrain, "brokers: pending messages per drain, and events per raw publish loop")
	rates := fs.String("rates", "200,1000", "latency: open-loop order rates per second")
	fs.DurationVar(&c.LatencyDuration, "latency-duration", c.LatencyDuration, "latency: length of each open-loop run")
	fs.IntVar(&c.History, "history", c.History, "history: delivered rows retained (the issue's large case is 10000000)")
	large := fs.Bool("history-large", false, "history: retain 10,000,000 delivered rows instead")
	fs.IntVar(&c.ClaimSamples, "claim-samples", c.ClaimSamples, "history: claims timed per case")
	fs.IntVar(&c.PruneRows, "prune", c.PruneRows, "prune: delivered rows the prune job deletes under load (≤ -history)")
	fs.IntVar(&c.ScaleDrain, "scale-drain", c.ScaleDrain, "scale-out: pending messages preloaded")
	fs.IntVar(&c.ScaleReps, "scale-reps", c.ScaleReps, "scale-out: repetitions")
	relays := fs.String("relays", "1,2,4", "scale-out: relay counts")
	fs.IntVar(&c.IsolationRate, "isolation-rate", c.IsolationRate, "isolation: orders per second")
	fs.DurationVar(&c.IsolationDuration, "isolation-duration", c.IsolationDuration, "isolation: length of each row")
	fs.IntVar(&c.RecoveryReps, "recovery-reps", c.RecoveryReps, "recovery: SIGKILLs measured")
	fs.IntVar(&c.ManyEndpoints, "many-endpoints", c.ManyEndpoints, "endpoints: endpoints of the fan-out, and of the idle cost beside endpoints that are down")
	fs.IntVar(&c.DownBacklog, "down-backlog", c.DownBacklog, "endpoints: pending messages of each endpoint that is down")
	fs.IntVar(&c.EndpointsRate, "endpoints-rate", c.EndpointsRate, "endpoints: orders per second to the healthy endpoints")
	fs.DurationVar(&c.Soak, "soak", 0, "run the soak for this long (1h or more for SOAK.md) instead of the suite")
	fs.IntVar(&c.SoakRate, "soak-rate", 0, "soak: orders per second (0: half of what the machine sustains, measured first)")
	fs.BoolVar(&c.SoakAV, "soak-autovacuum", true, "soak: turn the server's autovacuum on for the run if it is off (ALTER SYSTEM), and off again after")
	fs.StringVar(&c.SoakOut, "soak-out", "lab/bench/SOAK.md", "soak: the report to write (its plot, soak.svg, beside it)")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.BoolVar(&c.RelayProcs, "relay-procs", c.RelayProcs, "scale-out: run each relay as a separate process (else River clients in this process)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	var err error
	if c.LatencyRates, err = ints(*rates); err != nil {
		return c, err
	}
	if c.Relays, err = ints(*relays); err != nil {
		return c, err
	}
	if *large {
		c.History = 10_000_000
	}
	if *smoke {
		c = smokeConfig(c)
	}
	if *only != "" {
		c.Only = strings.Split(*only, ",")
		for _, name := range c.Only {
			if !strings.Contains(","+scenarioNames()+",", ","+name+",") {
				return c, fmt.Errorf("unknown scenario %q (have %s)", name, scenarioNames())
			}
		}
	}
	c.PruneRows = min(c.PruneRows, c.History)
	c.command = "go run ./lab/bench"
	if len(args) > 0 {
		c.command += " " + strings.Join(args, " ")
	}
	return c, nil
}

func scenarioNames() string {
	var names []string
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	return strings.Join(names, ",")
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &n); err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, cfg config, log io.Writer) error {
	progress = log
	rep := newReport()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	machine := machineFacts(ctx)
	for _, s := range scenarios {
		if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, s.name) {
			continue
		}
		if s.name == "knobs" && !cfg.Knobs {
			continue
		}
		t := time.Now()
		fmt.Fprintf(log, "bench: %s …\n", s.name)
		if err := s.run(ctx, cfg, rep); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Fprintf(log, "bench: %s done in %s\n", s.name, time.Since(t).Round(time.Second))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	doc := rep.markdown(cfg, machine, started, time.Since(started))
	if cfg.Out == "-" {
		_, err := io.WriteString(os.Stdout, doc)
		return err
	}
	if cfg.Out == "" {
		return errors.New("no -out")
	}
	return os.WriteFile(cfg.Out, []byte(doc), 0o644)
}
