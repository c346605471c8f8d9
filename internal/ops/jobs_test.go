package ops_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// The River queues the relay works (internal/outbox/relay.go).
var relayQueues = []string{"outbox_deliver", "outbox_prune"}

// riverAPI is the real api with a real relay beside it, on a fresh database.
type riverAPI struct{ *liveAPI }

// runAPIWithRelay starts the api (with ADMIN_TOKEN, so the ops page and
// River UI are open to it) and a relay, whose River client registers the
// relay's queues, and waits until River UI lists them.
func runAPIWithRelay(t *testing.T, ctx context.Context) *riverAPI {
	t.Helper()
	a := &riverAPI{startAPI(t, ctx, nil)}
	a.startRelay(t, ctx, relay.Config{
		PollInterval: 50 * time.Millisecond, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		DeliveryTimeout: 2 * time.Second, ClaimTimeout: time.Minute, MaxAttempts: 2,
	})

	require.Eventually(t, func() bool {
		names, status := a.queueNames(t, http.Header{"Authorization": {"Bearer " + token}})
		return status == http.StatusOK && hasAll(names, relayQueues)
	}, 30*time.Second, 50*time.Millisecond, "River UI never listed the relay's queues")
	return a
}

// queueNames asks River UI's API for its queues.
func (a *riverAPI) queueNames(t *testing.T, hdr http.Header) ([]string, int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, a.base+ops.JobsPath+"/api/queues", nil)
	require.NoError(t, err)
	req.Header = hdr
	res, err := noRedirects().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	if res.StatusCode != http.StatusOK {
		return nil, res.StatusCode
	}
	var list struct {
		Data []struct {
			Name string `json:"name"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(raw, &list), "%s", raw)
	var names []string
	for _, q := range list.Data {
		names = append(names, q.Name)
	}
	return names, res.StatusCode
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// noRedirects is a client that shows each answer, redirects included.
func noRedirects() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// TestJobsRiverUIIsBehindTheLogin: without credentials River UI gives
// nothing away (a person is sent to the login form, its API answers 401);
// with the admin token it lists the relay's queues.
func TestJobsRiverUIIsBehindTheLogin(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := runAPIWithRelay(t, ctx)
	c := noRedirects()

	// A person opening River UI's pages signs in first; nothing of it shows.
	for _, p := range []string{ops.JobsPath, ops.JobsPath + "/", ops.JobsPath + "/queues", ops.JobsPath + "/jobs?state=running"} {
		res, body := call(t, c, http.MethodGet, a.base+p, "", "Accept", "text/html")
		require.Equal(t, http.StatusSeeOther, res.StatusCode, p)
		require.Equal(t, "/ops/login?"+url.Values{"next": {p}}.Encode(), res.Header.Get("Location"), p)
		require.NotContains(t, body, "config__json", p)
		require.NotContains(t, body, "/assets/", p)
	}
	// Its API, and any action, answer 401 in River UI's error shape.
	for _, req := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/queues", ""},
		{http.MethodGet, "/api/jobs?state=completed", ""},
		{http.MethodPost, "/api/jobs/cancel", `{"ids":["1"]}`},
		{http.MethodPut, "/api/queues/outbox_deliver/pause", `{}`},
	} {
		res, body := call(t, c, req.method, a.base+ops.JobsPath+req.path, req.body, "Content-Type", "application/json")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "%s %s", req.method, req.path)
		require.Equal(t, `Bearer realm="admin"`, res.Header.Get("WWW-Authenticate"))
		require.Contains(t, body, `"message":`)
		for _, q := range relayQueues {
			require.NotContains(t, body, q)
		}
	}
	var paused int64
	require.NoError(t, a.pool.QueryRow(ctx, `SELECT count(*) FROM river_queue WHERE paused_at IS NOT NULL`).Scan(&paused))
	require.Zero(t, paused, "an unauthenticated pause went through")

	// With the token: the relay's queues (runAPIWithRelay waited for them).
	names, status := a.queueNames(t, http.Header{"Authorization": {"Bearer " + token}})
	require.Equal(t, http.StatusOK, status)
	require.Subset(t, names, relayQueues)

	// The page itself, under the ops page's headers but a policy that lets
	// River UI's own scripts (and only those) run.
	res, body := call(t, c, http.MethodGet, a.base+ops.JobsPath+"/", "", "Authorization", "Bearer "+token, "Accept", "text/html")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, `"apiUrl":"/ops/river/api"`)
	csp := res.Header.Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"} {
		require.Contains(t, csp, d)
	}
	require.Regexp(t, `(^|; )script-src 'self'(;|$)`, csp, "River UI's scripts come from here, none inline, no eval")
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
	require.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
	require.Equal(t, "no-referrer", res.Header.Get("Referrer-Policy"))
	// Its module script is served as JavaScript, which nosniff requires.
	m := regexp.MustCompile(`<script type="module" src="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, m, "no module script on River UI's page")
	require.True(t, strings.HasPrefix(m[1], ops.JobsPath+"/assets/"), m[1])
	res, _ = call(t, c, http.MethodGet, a.base+m[1], "", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, res.Header.Get("Content-Type"), "javascript")
	res, _ = call(t, c, http.MethodGet, a.base+m[1], "")
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "River UI's assets are behind the login too")

	// The ops page's own pages keep their script-free policy.
	res, _ = call(t, c, http.MethodGet, a.base+"/ops", "", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NotContains(t, res.Header.Get("Content-Security-Policy"), "script-src")
	require.NotContains(t, a.log.String(), token)
}

// opsTestArgs is a job nobody works: River UI's actions are tried on it.
type opsTestArgs struct{}

func (opsTestArgs) Kind() string { return "ops_test_noop" }

// TestJobsRiverUIActionsRefuseOtherSites: River UI's actions are JSON
// requests with the session cookie and no CSRF field; one from another site
// is refused (403) and changes nothing, the same one from River UI's own
// page goes through, and is logged as an ops action.
func TestJobsRiverUIActionsRefuseOtherSites(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := runAPIWithRelay(t, ctx)

	// A job waiting an hour, in a queue nobody works.
	client, err := river.NewClient(riverpgxv5.New(a.pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ins, err := client.Insert(ctx, opsTestArgs{}, &river.InsertOpts{Queue: "ops_test", ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	jobID := ins.Job.ID
	state := func() rivertype.JobState {
		job, err := client.JobGet(ctx, jobID)
		require.NoError(t, err)
		return job.State
	}
	require.Equal(t, rivertype.JobStateScheduled, state())

	// Signed in with the form, as a person is.
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res := post(t, browser, a.base+"/ops/login", url.Values{"token": {token}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	res, body := call(t, browser, http.MethodGet, a.base+ops.JobsPath+"/api/jobs/"+strconv.FormatInt(jobID, 10), "")
	require.Equal(t, http.StatusOK, res.StatusCode, "the cookie opens River UI: %s", body)

	cancelJob := `{"ids":["` + strconv.FormatInt(jobID, 10) + `"]}`
	// From another site: a form can send this very body as text/plain.
	for _, hdr := range [][]string{
		{"Sec-Fetch-Site", "cross-site", "Content-Type", "text/plain"},
		{"Sec-Fetch-Site", "same-site", "Content-Type", "application/json"},
		{"Origin", "https://evil.example", "Content-Type", "text/plain"},
	} {
		res, body := call(t, browser, http.MethodPost, a.base+ops.JobsPath+"/api/jobs/cancel", cancelJob, hdr...)
		require.Equal(t, http.StatusForbidden, res.StatusCode, "%v: %s", hdr, body)
		require.Equal(t, rivertype.JobStateScheduled, state(), "%v cancelled the job", hdr)
	}
	require.NotContains(t, a.log.String(), `"action":"river_ui"`, "a refused request is no action")

	// From River UI's own page: cancelled, and logged with who and what.
	res, body = call(t, browser, http.MethodPost, a.base+ops.JobsPath+"/api/jobs/cancel", cancelJob,
		"Sec-Fetch-Site", "same-origin", "Origin", a.base, "Content-Type", "application/json")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, rivertype.JobStateCancelled, state())
	require.Eventually(t, func() bool { return strings.Contains(a.log.String(), `"action":"river_ui"`) },
		5*time.Second, 10*time.Millisecond)
	var action map[string]any
	for line := range strings.SplitSeq(a.log.String(), "\n") {
		if strings.Contains(line, `"action":"river_ui"`) {
			require.NoError(t, json.Unmarshal([]byte(line), &action))
		}
	}
	require.Equal(t, "ops action", action["msg"])
	require.Equal(t, "cookie", action["auth"])
	require.Equal(t, "POST", action["method"])
	require.Equal(t, "/ops/river/api/jobs/cancel", action["path"])
	require.Equal(t, cancelJob, action["body"])
	require.EqualValues(t, http.StatusOK, action["status"])
	require.NotContains(t, a.log.String(), token)
}
