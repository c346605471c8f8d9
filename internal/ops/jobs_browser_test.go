package ops_test

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/ops"
)

// recordCSPViolations runs in every page before its own scripts: the
// browser's report of each thing the Content-Security-Policy blocked.
const recordCSPViolations = `window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.effectiveDirective + " blocked " + (e.blockedURI || "inline") + " (" + e.sourceFile + ":" + e.lineNumber + ")");
});`

// TestBrowserRiverUIShowsTheRelaysQueues signs in to the ops page in
// headless Chromium, with scripts on (River UI is a JavaScript app), opens
// River UI's queues and waits until it shows the relay's queues: proof that
// its scripts and styles load under the policy the ops page sets there, and
// that its API answers with the session cookie alone. Nothing may be
// blocked on the way, nor fail in the console.
func TestBrowserRiverUIShowsTheRelaysQueues(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := runAPIWithRelay(t, ctx)

	bctx, shot := headless(t, ctx, true)
	do := browserPage{t, bctx}.do

	// Everything the console says, from here on: River UI must say nothing
	// that is an error.
	var mu sync.Mutex
	var console []chromedp.ConsoleMessage
	consoleCtx, stopConsole := context.WithCancel(bctx)
	defer stopConsole()
	messages := chromedp.Console(consoleCtx)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			mu.Lock()
			console = append(console, m)
			mu.Unlock()
		}
	}()
	_, err := chromedp.Run(bctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: recordCSPViolations})
		return err
	}))
	require.NoError(t, err)

	// River UI without a session: the login form, then River UI itself.
	do(chromedp.Navigate(a.base+ops.JobsPath+"/queues"), chromedp.WaitReady(chromedp.ID("token")))
	location, err := chromedp.Run(bctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, a.base+"/ops/login?next=%2Fops%2Friver%2Fqueues", location)
	// Signing in goes back to the page asked for.
	do(chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, bctx, chromedp.Click(chromedp.ID("login")))

	// River UI renders after its scripts have fetched the queues: read the
	// page's text until both names are there.
	deadline := time.Now().Add(30 * time.Second)
	var text string
	for {
		text, err = chromedp.Run(bctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		require.NoError(t, err)
		if strings.Contains(text, relayQueues[0]) && strings.Contains(text, relayQueues[1]) {
			break
		}
		require.True(t, time.Now().Before(deadline), "River UI never showed the relay's queues; the page says:\n%s", text)
		time.Sleep(100 * time.Millisecond)
	}
	for _, q := range relayQueues {
		require.Contains(t, text, q)
	}
	location, err = chromedp.Run(bctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, a.base+ops.JobsPath+"/queues", location)
	shot("10-river-ui-queues.png")

	// One of River UI's own actions, from its page: pause the prune queue,
	// then resume it. Its JSON requests carry the session cookie and no CSRF
	// field; coming from the page itself, they pass, and are logged.
	paused := func() bool {
		var p bool
		require.NoError(t, a.pool.QueryRow(ctx, `SELECT paused_at IS NOT NULL FROM river_queue WHERE name = 'outbox_prune'`).Scan(&p))
		return p
	}
	row := `tr:has(a[href="` + ops.JobsPath + `/queues/outbox_prune"])`
	do(chromedp.Click(chromedp.CSS(row + ` button[title="Pause"]`)))
	require.Eventually(t, paused, 10*time.Second, 20*time.Millisecond, "pausing from River UI did not pause the queue")
	do(chromedp.WaitVisible(chromedp.CSS(row+` button[title="Resume"]`)),
		chromedp.Click(chromedp.CSS(row+` button[title="Resume"]`)))
	require.Eventually(t, func() bool { return !paused() }, 10*time.Second, 20*time.Millisecond,
		"resuming from River UI did not resume the queue")
	do(chromedp.WaitVisible(chromedp.CSS(row + ` button[title="Pause"]`)))
	for _, action := range []string{"pause", "resume"} {
		logged := regexp.MustCompile(`"msg":"ops action","action":"river_ui","auth":"cookie",.*"method":"PUT","path":"/ops/river/api/queues/outbox_prune/` + action + `".*"status":200`)
		require.Eventually(t, func() bool { return logged.MatchString(a.log.String()) }, 5*time.Second, 10*time.Millisecond,
			"River UI's %s was not logged as an ops action", action)
	}

	// The overview links to River UI: the link a person follows.
	do(chromedp.Navigate(a.base+"/ops"), chromedp.WaitReady(chromedp.ID("river-ui-link")))
	follow(t, bctx, chromedp.Click(chromedp.ID("river-ui-link")))
	location, err = chromedp.Run(bctx, chromedp.Location())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(location, a.base+ops.JobsPath+"/"), "the overview's River UI link led to %s", location)

	// One refusal is expected: River UI's validation library (zod) probes
	// once whether eval works and, refused, validates without it.
	violations, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`window.__cspViolations`))
	require.NoError(t, err)
	violations = slices.DeleteFunc(violations, func(v string) bool { return strings.HasPrefix(v, "script-src blocked eval ") })
	require.Empty(t, violations, "the Content-Security-Policy blocked part of River UI")
	stopConsole()
	<-consoleDone
	mu.Lock()
	defer mu.Unlock()
	for _, m := range console {
		t.Logf("console %s (%s): %s", m.Type, m.URL, m.Text)
		if m.Source == "security" && strings.Contains(m.Text, "'unsafe-eval'") {
			continue // the probe above
		}
		if m.URL == a.base+"/favicon.ico" {
			continue // the ops pages have no icon; River UI has its own
		}
		require.False(t, m.IsException() || m.Type == "error", "River UI failed in the browser: %s %s", m.Type, m.Text)
	}
	require.NotContains(t, a.log.String(), token)
}

// TestBrowserRiverUIShowsARelayJob opens, in headless Chromium with scripts
// on, River UI's page of one of the relay's own jobs (the prune it runs at
// start) under the ops page's mount, and waits until it shows the job as
// the database holds it: its id, kind, queue and state.
func TestBrowserRiverUIShowsARelayJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := runAPIWithRelay(t, ctx)
	bctx, shot := headless(t, ctx, true)
	b := browserPage{t, bctx}

	// The relay's prune, once it has run: a job whose row no longer moves.
	var id int64
	var kind, queue, state string
	require.Eventually(t, func() bool {
		err := a.pool.QueryRow(ctx, `SELECT id, kind, queue, state FROM river_job
			WHERE kind = 'outbox_prune' AND finalized_at IS NOT NULL ORDER BY id LIMIT 1`).Scan(&id, &kind, &queue, &state)
		return err == nil
	}, 60*time.Second, 50*time.Millisecond, "the relay never ran its prune at start")
	require.Contains(t, relayQueues, queue, "the prune runs on one of the relay's queues")

	// Signing in on the way to it returns to the job's page.
	jobPage := a.base + ops.JobsPath + "/jobs/" + strconv.FormatInt(id, 10)
	b.do(chromedp.Navigate(jobPage), chromedp.WaitReady(chromedp.ID("token")), chromedp.SendKeys(chromedp.ID("token"), token))
	follow(t, bctx, chromedp.Click(chromedp.ID("login")))
	require.Equal(t, jobPage, b.location())

	// River UI draws the job once its scripts have fetched it.
	deadline := time.Now().Add(30 * time.Second)
	var text string
	for {
		var err error
		text, err = chromedp.Run(bctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		require.NoError(t, err)
		if strings.Contains(text, kind) && strings.Contains(text, queue) {
			break
		}
		require.True(t, time.Now().Before(deadline), "River UI never showed job %d; the page says:\n%s", id, text)
		time.Sleep(100 * time.Millisecond)
	}
	require.Contains(t, text, "ID: "+strconv.FormatInt(id, 10), "the page is the job's")
	require.Contains(t, strings.ToLower(text), strings.ToLower(state), "the page shows the job's state in the database")
	shot("75-river-ui-job.png")
}
