package ops_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/proctest"
)

// liveAPI is the real api, run in-process as cmd/api runs it, on a fresh
// database, with a pool of its own for the test's checks.
type liveAPI struct {
	base string
	pool *pgxpool.Pool
	log  *proctest.Output
}

// startAPI runs the api with ADMIN_TOKEN (so the ops page is open to the
// test), private webhook targets allowed and JSON logs, plus extra, until
// the test ends; its log is printed if the test fails.
func startAPI(t *testing.T, ctx context.Context, extra map[string]string) *liveAPI {
	t.Helper()
	dbURL := dbtest.URL(t)
	addr := proctest.FreeAddr(t)
	a := &liveAPI{base: "http://" + addr, log: &proctest.Output{}}
	env := map[string]string{"DATABASE_URL": dbURL, "API_ADDR": addr, "ADMIN_TOKEN": token,
		"OUTBOX_ALLOW_PRIVATE_TARGETS": "true", "LOG_FORMAT": "json"}
	maps.Copy(env, extra)
	apiCtx, stopAPI := context.WithCancel(ctx)
	apiDone := make(chan error, 1)
	go func() { apiDone <- apiserver.Run(apiCtx, nil, proctest.Environ(env), a.log) }()
	t.Cleanup(func() {
		stopAPI()
		if err := <-apiDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("api: %v", err)
		}
		if t.Failed() {
			t.Logf("api log:\n%s", a.log.String())
		}
	})
	waitHealthy(t, a.base)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	a.pool = pool
	return a
}

// startRelay runs a real relay (River, dispatch, heartbeat) on the api's
// database until the test ends, delivering to private addresses.
func (a *liveAPI) startRelay(t *testing.T, ctx context.Context, cfg relay.Config) *relay.Relay {
	t.Helper()
	relay, err := relay.New(a.pool, cfg, &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx))
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = relay.Stop(sctx)
	})
	return relay
}

// follow runs a step that navigates (a click on a link or a submit button,
// Enter in a form's field) and returns once the new page has loaded. Reading
// the page any earlier races the browser: Chrome renumbers the document's
// nodes at DOMContentLoaded, so a node found while the page was still being
// parsed is gone when its text is read ("No node with given id found").
func follow(t *testing.T, bctx context.Context, step chromedp.Action[chromedp.Void]) {
	t.Helper()
	_, err := chromedp.RunResponse(bctx, step)
	require.NoError(t, err)
}

// headless starts Chromium (headless, no sandbox as CI runs as root,
// nothing phoning home) and returns its context and a function that saves
// a full-page screenshot. With scripts false, scripts are off: the ops page
// must work without them. A machine without Chromium skips the test.
func headless(t *testing.T, ctx context.Context, scripts bool) (context.Context, func(name string)) {
	t.Helper()
	browser := chromiumPath()
	if browser == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no Chromium installed under CI (.ci/ensure-chromium should have installed it)")
		}
		t.Skip("no Chromium installed (run .ci/ensure-chromium, or set CHROMIUM_PATH): skipping a browser test")
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true),
		chromedp.Flag("force-device-scale-factor", "1"),
		// Back and Forward load the page again, as its no-store asks: a page
		// restored from the back-forward cache fires no load event, and
		// chromedp's NavigateBack would wait for one until its deadline.
		chromedp.Flag("disable-features", "BackForwardCache"),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1360, 900),
	)
	t.Cleanup(cancelAlloc)
	bctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancel)
	if !scripts {
		_, err := chromedp.Run(bctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return err
		}))
		require.NoError(t, err)
	}
	dir := screenshotDir(t)
	return bctx, func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, png, 0o644))
		t.Logf("screenshot: %s", p)
	}
}

// browserPage reads and drives the browser of a test; each method fails the test
// on an error. Selectors are CSS.
type browserPage struct {
	t   *testing.T
	ctx context.Context
}

// do runs steps that do not navigate (follow is for those that do).
func (p browserPage) do(steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	require.NoError(p.t, chromedp.Do(p.ctx, steps...))
}

func (p browserPage) attr(sel, name string) string {
	p.t.Helper()
	attrs, err := chromedp.Run(p.ctx, chromedp.Attributes(chromedp.CSS(sel)))
	require.NoError(p.t, err)
	return attrs[name]
}

func (p browserPage) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(p.t, err)
	return s
}

func (p browserPage) html(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.OuterHTML(chromedp.CSS(sel)))
	require.NoError(p.t, err)
	return s
}

// number reads the number a KPI holds (data-value) and checks that it is
// the one it shows.
func (p browserPage) number(sel string) int64 {
	p.t.Helper()
	v, err := strconv.ParseInt(p.attr(sel, "data-value"), 10, 64)
	require.NoError(p.t, err, "data-value of %s", sel)
	m := shownNumber.FindStringSubmatch(p.html(sel))
	require.NotNil(p.t, m, "%s shows no number", sel)
	require.Equal(p.t, strconv.FormatInt(v, 10), strings.ReplaceAll(m[1], ",", ""), "%s shows another number than it holds", sel)
	return v
}

var shownNumber = regexp.MustCompile(`>([\d,]+)<`)
