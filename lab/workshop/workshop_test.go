package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// The labs that kill processes run this test binary as their child.
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	os.Exit(m.Run())
}

// Each lab runs for real at a small size; its report must show what
// lab/workshop/README.md says it shows (the same lines, numbers aside) and the
// counts must keep the lab's promise.
func TestLabs(t *testing.T) {
	doc, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		lab   int
		opts  options
		check func(t *testing.T, c map[string]int64, x map[string]string)
	}{
		{1, options{N: 60}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["phantom"] > 0, "phantom events > 0", c)
			want(t, c["phantom"] == c["refused"], "every refused commit is a phantom event", c)
			want(t, c["lost"] == 0, "no lost events", c)
		}},
		{2, options{N: 60}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["lost"] > 0, "lost events > 0", c)
			want(t, c["lost"] == c["killed"], "every kill between commit and publish loses an event", c)
			want(t, c["phantom"] == 0, "no phantom events", c)
		}},
		{3, options{N: 60}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["refused"] > 0 && c["killed"] > 0 && c["relay_killed"] == 1, "the failures were injected", c)
			want(t, c["lost"] == 0 && c["phantom"] == 0, "lost 0, phantom 0", c)
			want(t, c["duplicates"] > 0, "the relay's death produced duplicates", c)
			want(t, c["once"] == c["orders"] && c["more"] == 0, "every order applied exactly once", c)
		}},
		{4, options{N: 200}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["naive.duplicates"] > 0, "duplicates without a claim", c)
			want(t, c["claim.duplicates"] == 0 && c["claim.unique"] == 200, "none with the claim", c)
		}},
		{5, options{N: 20}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["claimed"] > 0 && c["released"] == c["claimed"] && c["delivered"] == 20, "held, released, delivered", c)
			want(t, c["lost"] == 0 && c["duplicates"] == 0, "nothing lost or doubled", c)
		}},
		{6, options{N: 20}, func(t *testing.T, c map[string]int64, x map[string]string) {
			want(t, c["healthy"] == 20, "the healthy messages flowed", c)
			want(t, x["poison_status"] == "failed" && c["poison_attempts"] == 4, "the poison message failed at the cap", c)
			want(t, x["after_retry"] == "delivered", "delivered after the requeue", c)
		}},
		{7, options{History: 20_000}, func(t *testing.T, c map[string]int64, x map[string]string) {
			want(t, strings.Contains(x["plan.grown"], "outbox_messages_pending_idx"), "the claim reads the partial index", c)
			want(t, c["buffers.noindex"] > 10*c["buffers.grown"], "without it, the claim reads the history", c)
			want(t, c["pruned"] == 18_000 && c["kept"] == 2_000, "pruned past the retention only", c)
		}},
		{8, options{N: 20}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["naive.healthy"] < 20, "the single queue falls behind", c)
			want(t, c["isolated.healthy"] == 20, "the outbox relay delivers every healthy message", c)
		}},
		{9, options{N: 5}, func(t *testing.T, c map[string]int64, _ map[string]string) {
			want(t, c["stored.first"] == 5 && c["stored.inside"] == 5, "inside the window the broker dropped the republished events", c)
			want(t, c["stored.after"] == 10, "past the window they were stored again", c)
			want(t, c["applied"] == 5 && c["duplicates"] == 5 && c["ledger"] == 5, "the inbox caught them: each applied once", c)
		}},
	}
	for _, tc := range cases {
		ok := t.Run(labs[tc.lab-1].title, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out, progressOut bytes.Buffer
			rep, err := runLab(ctx, tc.lab, tc.opts, &out, &progressOut, false)
			t.Logf("report:\n%s", out.String())
			if err != nil {
				t.Fatalf("lab %d: %v\nprogress:\n%s", tc.lab, err, progressOut.String())
			}
			if !strings.Contains(progressOut.String(), "· ") {
				t.Errorf("no progress shown")
			}
			tc.check(t, rep.Counts, rep.Texts)

			documented := documentedOutput(t, string(doc), tc.lab)
			if got, want := normalize(out.String()), normalize(documented); got != want {
				t.Errorf("lab %d's report no longer matches lab/workshop/README.md (numbers aside).\ngot:\n%s\ndocumented:\n%s", tc.lab, got, want)
			}
		})
		if !ok {
			t.Logf("lab %d failed", tc.lab)
		}
	}
}

func want(t *testing.T, ok bool, what string, counts map[string]int64) {
	t.Helper()
	if !ok {
		t.Errorf("%s: counts %v", what, counts)
	}
}

// documentedOutput is the fenced block after "<!-- output: lab N -->".
func documentedOutput(t *testing.T, doc string, lab int) string {
	t.Helper()
	marker := "<!-- output: lab " + string(rune('0'+lab)) + " -->"
	_, after, ok := strings.Cut(doc, marker)
	if !ok {
		t.Fatalf("lab/workshop/README.md has no %q", marker)
	}
	_, after, ok = strings.Cut(after, "```text\n")
	if !ok {
		t.Fatalf("no ```text block after %q", marker)
	}
	block, _, ok := strings.Cut(after, "```")
	if !ok {
		t.Fatalf("unterminated block after %q", marker)
	}
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
