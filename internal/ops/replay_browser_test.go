package ops_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/ops"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// shownInt reads a number as the pages write it (1,005).
func shownInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	require.NoError(t, err)
	return n
}

// TestBrowserReplayAndDiscardFromTheEndpointPage replays an endpoint's
// past events from its own page, in headless Chromium with scripts off,
// then discards what waits for it; both ranges are larger than one
// request settles (the budget ends each request after its first batch),
// so each ends on the page that offers to continue. Every number a page
// says is the database's: the events the confirmation counts, the events
// replayed and skipped so far and in all, the messages discarded so far
// and in all, what still waits between requests, and what waits afterwards.
func TestBrowserReplayAndDiscardFromTheEndpointPage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	e := newEnv(t, token, func(o *ops.Options) { o.ReplayBudget = time.Nanosecond })
	base := e.srv.URL
	b := browserPage{t, bctx}
	do, text, html := b.do, b.text, b.html
	ep := e.endpoint(t, "http://127.0.0.1:9/replay/a", "order.placed", "order.cancelled")
	self := "/ops/endpoints/" + ep.ID.String()

	// More placed events in the last hour than a replay's batch, some
	// cancellations beside them, and placed events from before the hour;
	// the newest few still wait for the endpoint.
	e.exec(t, `INSERT INTO outbox_events (id, type, payload, created_at)
		SELECT outbox_uuid_v7_at(x.at), x.type, json_build_object('n', x.g), x.at
		FROM (SELECT g, clock_timestamp() - $2::interval AS at, $3::text AS type FROM generate_series(1, $1::integer) g) x`,
		admin.MaxReplayBatch+7, "10 minutes", "order.placed")
	e.exec(t, `INSERT INTO outbox_events (id, type, payload, created_at)
		SELECT outbox_uuid_v7_at(x.at), x.type, json_build_object('n', x.g), x.at
		FROM (SELECT g, clock_timestamp() - $2::interval AS at, $3::text AS type FROM generate_series(1, $1::integer) g) x`,
		11, "5 minutes", "order.cancelled")
	e.exec(t, `INSERT INTO outbox_events (id, type, payload, created_at)
		SELECT outbox_uuid_v7_at(x.at), x.type, json_build_object('n', x.g), x.at
		FROM (SELECT g, clock_timestamp() - $2::interval AS at, $3::text AS type FROM generate_series(1, $1::integer) g) x`,
		13, "3 hours", "order.placed")
	e.exec(t, `INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(id), id, type, $1, created_at, created_at FROM outbox_events
		WHERE type = 'order.placed' ORDER BY id DESC LIMIT 3`, ep.ID)
	messages := func() int64 {
		return e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1`, ep.ID)
	}

	// The endpoint's page: its replay form, prefilled with the last hour
	// and every type; only order.placed is kept.
	signIn(t, b, base)
	do(chromedp.Navigate(base+self), chromedp.WaitReady(chromedp.ID("endpoint-state")),
		chromedp.Click(chromedp.CSS(`#replay-`+ep.ID.String()+` summary`)),
		chromedp.WaitVisible(chromedp.ID("replay-submit-"+ep.ID.String())),
		chromedp.Click(chromedp.CSS(`#replay-`+ep.ID.String()+` input[name="type"][value="order.cancelled"]`)))
	shot("60-endpoint-replay-form.png")
	before := messages()
	follow(t, bctx, chromedp.Click(chromedp.ID("replay-submit-"+ep.ID.String())))

	// The confirmation counts the placed events of the range, as the
	// database holds them, and has written nothing.
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	from, err := time.Parse(time.RFC3339Nano, b.attr(`form.confirm-actions input[name="from"]`, "value"))
	require.NoError(t, err)
	to, err := time.Parse(time.RFC3339Nano, b.attr(`form.confirm-actions input[name="to"]`, "value"))
	require.NoError(t, err)
	inRange := e.count(t, `SELECT count(*) FROM outbox_events WHERE type = 'order.placed' AND created_at >= $1 AND created_at < $2`, from, to)
	waiting := e.count(t, `SELECT count(DISTINCT m.event_id) FROM outbox_messages m JOIN outbox_events ev ON ev.id = m.event_id
		WHERE m.destination = $1 AND m.status IN ('pending', 'claimed', 'failed') AND ev.type = 'order.placed'
		AND ev.created_at >= $2 AND ev.created_at < $3`, ep.ID, from, to)
	require.Less(t, inRange, e.count(t, `SELECT count(*) FROM outbox_events`), "the range and the type leave events out")
	m := regexp.MustCompile(`<dt>Events in the range</dt><dd>([\d,]+)</dd>`).FindStringSubmatch(html("main"))
	require.NotNil(t, m, "the confirmation says how many events are in the range")
	require.Equal(t, inRange, shownInt(t, m[1]), "the confirmation counts the database's events of the range and type")
	require.Contains(t, text("main"), "Re-send "+m[1]+" events to this endpoint?")
	require.Equal(t, before, messages(), "nothing is written before the confirmation")
	shot("61-confirm-replay.png")

	// Replaying: the range is more than a request replays, so it stops and
	// offers to continue, saying what it did so far.
	so := regexp.MustCompile(`so far it replayed ([\d,]+) events? \(([\d,]+) already waiting (?:was|were) skipped\)`)
	steps := 0
	for follow(t, bctx, chromedp.Click(chromedp.ID("confirm"))); b.exists("#confirm"); steps++ {
		require.Contains(t, text("h1"), "Replay not finished")
		m := so.FindStringSubmatch(text("main"))
		require.NotNil(t, m, "the continue page says what the replay did so far")
		require.Equal(t, messages()-before, shownInt(t, m[1]), "replayed so far: the messages it wrote")
		if steps == 0 {
			shot("62-replay-not-finished.png")
		}
		follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	}
	require.Positive(t, steps, "a range larger than a batch asks to continue")
	do(chromedp.WaitReady(chromedp.ID("endpoint-state")))
	require.Equal(t, base+self+"?done=replayed&m="+strconv.FormatInt(waiting, 10)+"&n="+strconv.FormatInt(inRange-waiting, 10),
		b.location(), "the replay returns to the endpoint's page")
	notice := regexp.MustCompile(`Replayed (\d+) events? \((\d+) already waiting (?:was|were) skipped\)`).FindStringSubmatch(text("p.notice"))
	require.NotNil(t, notice)
	require.Equal(t, messages()-before, shownInt(t, notice[1]), "the notice counts every message the replay wrote")
	require.Equal(t, inRange-waiting, shownInt(t, notice[1]), "every event of the range not waiting was replayed")
	require.Equal(t, waiting, shownInt(t, notice[2]), "the events still waiting were skipped")
	require.Zero(t, e.count(t, `SELECT count(*) FROM (SELECT event_id FROM outbox_messages WHERE destination = $1
		GROUP BY event_id HAVING count(*) > 1) d`, ep.ID), "no event was sent twice")
	shot("63-replay-done.png")

	// Discard what waits: more than a batch of the discard (10,000).
	e.exec(t, `WITH ev AS (
			INSERT INTO outbox_events (id, type, payload, created_at)
			SELECT outbox_uuid_v7_at(x.at), 'order.placed', '{}', x.at
			FROM (SELECT clock_timestamp() AS at FROM generate_series(1, 10000)) x
			RETURNING id, type, created_at)
		INSERT INTO outbox_messages (id, event_id, type, destination, next_attempt_at, created_at)
		SELECT outbox_uuid_sibling(id), id, type, $1, created_at, created_at FROM ev`, ep.ID)
	pending := func() int64 {
		return e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending'`, ep.ID)
	}
	discarded := func() int64 {
		return e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'discarded'`, ep.ID)
	}
	do(chromedp.Navigate(base+self), chromedp.WaitReady(chromedp.ID("discard-waiting")))
	require.Equal(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status IN ('pending', 'claimed')`, ep.ID),
		b.number("#endpoint-waiting"), "the page's waiting count is the database's")
	follow(t, bctx, chromedp.Click(chromedp.ID("discard-waiting")))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	m = regexp.MustCompile(`Discard the ([\d,]+) messages? waiting`).FindStringSubmatch(text("main"))
	require.NotNil(t, m)
	toDiscard := pending()
	require.Equal(t, toDiscard, shownInt(t, m[1]), "the confirmation counts the database's waiting messages")
	shot("64-confirm-discard.png")
	settled := regexp.MustCompile(`The discard has settled ([\d,]+) messages? so far`)
	steps = 0
	for follow(t, bctx, chromedp.Click(chromedp.ID("confirm"))); b.exists("#confirm"); steps++ {
		require.Contains(t, text("h1"), "Discard not finished")
		m := settled.FindStringSubmatch(text("main"))
		require.NotNil(t, m, "the continue page says how many it settled so far")
		require.Equal(t, discarded(), shownInt(t, m[1]), "settled so far: the messages discarded in the database")
		left := regexp.MustCompile(`<dt>Still waiting</dt><dd>([\d,]+)</dd>`).FindStringSubmatch(html("main"))
		require.NotNil(t, left, "the continue page says how many still wait")
		require.Equal(t, pending(), shownInt(t, left[1]), "still waiting: the database's pending messages")
		if pending() == 0 {
			require.Contains(t, text("main"), "none wait any more", "the last batch settled everything: the page does not say more wait")
			shot("65b-discard-none-left.png")
		}
		if steps == 0 {
			shot("65-discard-not-finished.png")
		}
		follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	}
	require.Positive(t, steps, "a discard larger than a batch asks to continue")
	do(chromedp.WaitReady(chromedp.ID("endpoint-waiting")))
	require.Zero(t, pending(), "nothing waits once the discard is done")
	require.Equal(t, toDiscard, discarded())
	require.Contains(t, text("p.notice"), "Discarded "+strconv.FormatInt(toDiscard, 10)+" waiting messages", "the notice counts every request's")
	require.Equal(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status IN ('pending', 'claimed')`, ep.ID),
		b.number("#endpoint-waiting"))
	shot("66-discard-done.png")
}
