package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary serve as a relay process for the
// scale-out scenario, as the bench binary does.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := runChild(); err != nil {
			os.Stderr.WriteString("bench relay: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario at tiny size, so the suite cannot rot: CI
// runs it with go test ./... . The figures mean nothing.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	out := filepath.Join(t.TempDir(), "PERFORMANCE.md")
	cfg, err := parseFlags([]string{"-smoke", "-out", out}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := run(ctx, cfg, testWriter{t}); err != nil {
		t.Fatal(err)
	}
	t.Logf("smoke suite took %s", time.Since(start).Round(time.Millisecond))
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{"## Targets", "## 1. Write path", "## 2. Drain", "## 3. Latency",
		"## 4. History does not slow the claim", "## 5. Scale-out", "## 6. Prune under load", "## 7. Knobs",
		"## 8. Head-of-line isolation at the defaults", "## 9. Recovery after SIGKILL", "## 10. Ordered drain",
		"## 13. Many endpoints", "Ordered drain: ", "| keyed |", "Poll or NOTIFY", "Index Scan"} {
		if !strings.Contains(doc, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Sections by number: 9 before 10.
	if i, j := strings.Index(doc, "## 9. "), strings.Index(doc, "## 10. "); i < 0 || j < i {
		t.Errorf("section 10 is not after section 9")
	}
}

// TestSoakSmoke runs the soak for seconds: the real api and worker built
// and started, the capacity measured, orders placed and their webhooks
// matched, the tables sampled, and SOAK.md and its plot written. Not in
// parallel with TestSmoke: both set the progress writer.
func TestSoakSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	out := filepath.Join(t.TempDir(), "SOAK.md")
	// The server's settings as they are: a test does not change them.
	cfg, err := parseFlags([]string{"-soak", "20s", "-soak-autovacuum=false", "-soak-out", out}, os.Stderr)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	require.NoError(t, runSoak(ctx, soakConfig{Duration: cfg.Soak, Rate: cfg.SoakRate, Out: cfg.SoakOut, Autovacuum: cfg.SoakAV}, testWriter{t}))
	doc, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Contains(t, string(doc), "| Nothing lost | every order placed reached the receiver |")
	require.Regexp(t, `\| Nothing lost \|[^\n]*, 0 never arrived;[^\n]*\| ✅ \|`, string(doc))
	require.Contains(t, string(doc), "half of the")
	svg, err := os.ReadFile(filepath.Join(filepath.Dir(out), "soak.svg"))
	require.NoError(t, err)
	require.Contains(t, string(svg), "<polyline")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// BenchmarkPlace is the write path as a Go benchmark: one order
// transaction per op, in each variant of section 1.
//
//	go test -run '^$' -bench Place -cpu 1,8 ./lab/bench
func BenchmarkPlace(b *testing.B) {
	ctx := context.Background()
	pools, closeWrite, err := openWrite(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer closeWrite()
	for _, v := range writeVariants {
		b.Run(strings.ReplaceAll(v.name, " ", "_"), func(b *testing.B) {
			place := v.place(pools)
			b.RunParallel(func(pb *testing.PB) {
				for i := int64(0); pb.Next(); i++ {
					if err := place(ctx, i); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkClaim times the relay's claim statement (batch 100, rolled back)
// on a backlog of 20,000 pending messages.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	db, err := newDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer db.drop() //nolint:errcheck
	pool, err := db.pool(ctx, 4)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if err := addEndpoints(ctx, pool, 4, "http://127.0.0.1:9/hook"); err != nil {
		b.Fatal(err)
	}
	if err := preloadPending(ctx, pool, 20_000); err != nil {
		b.Fatal(err)
	}
	l, err := leaseOne(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := claimOnce(ctx, pool, l); err != nil {
			b.Fatal(err)
		}
	}
}

// The report is the lab's, beside the suite that writes it: run from the
// repository root (as ./task bench does), the suite rewrites the very file
// committed here, never one in the product's docs.
func TestReportIsWrittenBesideTheSuite(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags(nil, os.Stderr)
	require.NoError(t, err)
	require.Equal(t, "lab/bench/PERFORMANCE.md", cfg.Out, "the bench writes its report beside itself")
	_, err = os.Stat(filepath.Join("..", "..", filepath.FromSlash(cfg.Out)))
	require.NoError(t, err, "the report the bench rewrites is committed")
}
