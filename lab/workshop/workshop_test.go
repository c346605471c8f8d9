package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	// The labs that kill processes run this test binary as their child.
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	os.Exit(m.Run())
}

// Each lab runs for real at the size lab/workshop/README.md shows; its
// counts must keep the lab's promise, and its report must be the README's
// sample but for its numbers: the same lines and words, and figures of the
// same shape (each zero where the sample has zero, and of the same order of
// magnitude elsewhere), so a sample that a change of the product made
// wrong fails here instead of misleading a room.
//
// Not parallel: the labs show times (a lock's wait, a relay's timeout), and
// run one at a time, as in a room.
func TestLabs(t *testing.T) {
	doc, err := os.ReadFile("README.md")
	require.NoError(t, err)
	cases := []struct {
		lab   int
		check func(t *testing.T, c map[string]int64, x map[string]string)
	}{
		{1, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.Positive(t, c["phantom"], "phantom events: %v", c)
			require.Equal(t, c["refused"], c["phantom"], "every refused commit is a phantom event")
			require.Zero(t, c["lost"], "no lost events")
		}},
		{2, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.Positive(t, c["lost"], "lost events: %v", c)
			require.Equal(t, c["killed"], c["lost"], "every kill between commit and publish loses an event")
			require.Zero(t, c["phantom"], "no phantom events")
		}},
		{3, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.True(t, c["refused"] > 0 && c["killed"] > 0 && c["relay_killed"] == 1, "the failures were injected: %v", c)
			require.True(t, c["lost"] == 0 && c["phantom"] == 0, "lost 0, phantom 0: %v", c)
			require.Positive(t, c["sent_again"], "the relay's death sent webhooks again: %v", c)
			require.GreaterOrEqual(t, c["silence"], int64(4000), "nothing was sent while the dead relay held the endpoint's lease")
			require.True(t, c["once"] == c["orders"] && c["more"] == 0 && c["duplicates"] == c["sent_again"],
				"with the inbox, every order applied exactly once: %v", c)
			require.Equal(t, c["sent_again"], c["no_inbox.more"], "without it, each webhook sent again applied again")
		}},
		{4, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.Positive(t, c["naive.duplicates"], "duplicates without a claim: %v", c)
			for _, k := range []string{"lock", "skip", "relay"} {
				require.Zero(t, c[k+".duplicates"], "none with %s: %v", k, c)
			}
			require.Greater(t, c["lock.time"], c["skip.time"], "a lock held without SKIP LOCKED makes the relays take turns")
			require.True(t, c["relay.served_a"] > 0 && c["relay.served_b"] > 0, "both outbox relays served endpoints: %v", c)
			require.Zero(t, c["relay.overlaps"], "one relay serves an endpoint at a time")
		}},
		{5, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.True(t, c["claimed"] > 0 && c["released"] == c["claimed"] && c["delivered"] == c["messages"], "held, released, delivered: %v", c)
			require.True(t, c["lost"] == 0 && c["duplicates"] == 0, "nothing lost or doubled: %v", c)
		}},
		{6, func(t *testing.T, c map[string]int64, x map[string]string) {
			require.Equal(t, c["healthy.of"], c["healthy"], "the healthy messages flowed")
			require.True(t, x["poison_status"] == "failed" && c["poison_attempts"] == 4, "the poison message failed at the cap: %v", x)
			require.Equal(t, "delivered", x["after_retry"], "delivered after the requeue")
		}},
		{7, func(t *testing.T, c map[string]int64, x map[string]string) {
			require.Positive(t, c["parallel.wrong"], "without per-key order, orders end wrong: %v", c)
			require.True(t, c["ordered.wrong"] == 0 && c["held.wrong"] == 0 && c["defence.wrong"] == 0, "with it, or the receiver's check, none: %v", c)
			require.Equal(t, c["ordered.refused"], c["ordered.waited"], "each cancellation behind a retried placement waited for it")
			require.Equal(t, c["held.failed"], c["held.held"], "a failed message holds its key")
			require.Equal(t, "delivered", x["held.skipped"], "a skip lets its key go on")
			require.Equal(t, "delivered", x["held.retried"], "so does a retry")
			require.Positive(t, c["defence.early"], "the reference consumer refused early cancellations")
		}},
		{8, func(t *testing.T, c map[string]int64, x map[string]string) {
			require.Contains(t, x["plan.grown"], "outbox_messages_pending_idx", "the claim reads the partial index")
			require.Greater(t, c["buffers.noindex"], 10*c["buffers.grown"], "without it, the claim reads the history")
			require.True(t, c["pruned"] == 90_000 && c["kept"] == 10_000, "pruned past the retention only: %v", c)
		}},
		{9, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.Less(t, c["naive.healthy"], c["naive.healthy.of"], "the single queue falls behind")
			require.Equal(t, c["isolated.healthy.of"], c["isolated.healthy"], "the outbox relay delivers every healthy message")
		}},
		{10, func(t *testing.T, c map[string]int64, _ map[string]string) {
			require.True(t, c["stored.first"] == 5 && c["stored.inside"] == 5, "inside the window the broker dropped the republished events: %v", c)
			require.Equal(t, int64(10), c["stored.after"], "past the window they were stored again")
			require.True(t, c["applied"] == 5 && c["duplicates"] == 5 && c["ledger"] == 5, "the inbox caught them: each applied once: %v", c)
		}},
	}
	require.Len(t, cases, len(labs), "every lab is checked")
	for _, tc := range cases {
		t.Run(labs[tc.lab-1].title, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out, progressOut bytes.Buffer
			rep, err := runLab(ctx, tc.lab, options{}, &out, &progressOut, false)
			t.Logf("report:\n%s", out.String())
			require.NoError(t, err, "lab %d; progress:\n%s", tc.lab, progressOut.String())
			require.Contains(t, progressOut.String(), "· ", "progress is shown")
			tc.check(t, rep.Counts, rep.Texts)

			documented := documentedOutput(t, string(doc), tc.lab)
			require.Equal(t, normalize(documented), normalize(out.String()),
				"lab %d's report no longer matches lab/workshop/README.md (numbers aside)", tc.lab)
			for _, problem := range figureDrift(documented, out.String()) {
				t.Errorf("lab %d: README.md's sample has figures no run gives any more: %s", tc.lab, problem)
			}
		})
	}
}

// Figures drift when their shape changes: a zero that is not zero any more
// (or the reverse), or a figure off by more than an order of magnitude's
// share; run to run noise stays within it.
func TestFigureDrift(t *testing.T) {
	t.Parallel()
	require.Empty(t, figureDrift("  sent 270 / 230  1.2s\n", "  sent 262 / 238  0.4s\n"), "noise")
	require.Empty(t, figureDrift("  duplicates 1\n  lost 0\n", "  duplicates 3\n  lost 0\n"), "noise around small counts")
	require.Len(t, figureDrift("  sent 270 / 230\n", "  sent 0 / 500\n"), 1, "a zero where the sample has none")
	require.Len(t, figureDrift("  claimed 32\n", "  claimed 2\n"), 1, "a count sixteen times smaller")
	require.Len(t, figureDrift("  failed after 2.4s\n", "  failed after 0.5s\n"), 1, "a duration five times shorter")
	require.Empty(t, figureDrift("  Seq Scan 2 buffers, 1.39 ms\n", "  Seq Scan 3 buffers, 6.10 ms\n"), "milliseconds of a loaded machine")
	require.Empty(t, figureDrift("  all delivered after 0.0s\n", "  all delivered after 0.2s\n"), "a duration that rounds to zero")
}

// documentedOutput is the fenced block after "<!-- output: lab N -->".
func documentedOutput(t *testing.T, doc string, lab int) string {
	t.Helper()
	marker := "<!-- output: lab " + strconv.Itoa(lab) + " -->"
	_, after, ok := strings.Cut(doc, marker)
	require.True(t, ok, "lab/workshop/README.md has no %q", marker)
	_, after, ok = strings.Cut(after, "```text\n")
	require.True(t, ok, "no ```text block after %q", marker)
	block, _, ok := strings.Cut(after, "```")
	require.True(t, ok, "unterminated block after %q", marker)
	return block
}

var (
	number = regexp.MustCompile(`\d+(\.\d+)?`)
	spaces = regexp.MustCompile(`\s+`)
)

// normalize keeps what a report says, not its numbers or alignment.
func normalize(s string) string {
	var lines []string
	for l := range strings.SplitSeq(s, "\n") {
		l = strings.TrimSpace(spaces.ReplaceAllString(number.ReplaceAllString(l, "N"), " "))
		if l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// figureDrift compares the figures of a documented report with a run's,
// line by line (the two have the same lines: normalize), and says which
// are no longer of the run's shape: a count that is zero in one and not in
// the other, or figures more than four times apart beyond a slack, so that
// 1 and 3 duplicates, 0.0 s and 0.4 s, or 1 ms and 6 ms are alike: 2 for a
// count, 0.1 for seconds, 10 for milliseconds.
func figureDrift(documented, run string) []string {
	docLines, runLines := figureLines(documented), figureLines(run)
	var problems []string
	for i := range min(len(docLines), len(runLines)) {
		dl, rl := docLines[i], runLines[i]
		dn, rn := number.FindAllStringIndex(dl, -1), number.FindAllStringIndex(rl, -1)
		for j := range min(len(dn), len(rn)) {
			ds, rs := dl[dn[j][0]:dn[j][1]], rl[rn[j][0]:rn[j][1]]
			d, _ := strconv.ParseFloat(ds, 64)
			r, _ := strconv.ParseFloat(rs, 64)
			slack := 2.0
			switch {
			case strings.HasPrefix(dl[dn[j][1]:], " ms"):
				slack = 10
			case strings.Contains(ds, "."):
				slack = 0.1
			}
			switch lo, hi := min(d, r), max(d, r); {
			case (d == 0) != (r == 0) && slack == 2, hi+slack > 4*(lo+slack):
				problems = append(problems, fmt.Sprintf("%s where a run gives %s, in %q", ds, rs, strings.TrimSpace(dl)))
			}
		}
	}
	return problems
}

// figureLines are a report's lines that are not blank.
func figureLines(s string) []string {
	var lines []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}
