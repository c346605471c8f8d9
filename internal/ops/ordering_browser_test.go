package ops_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
)

// TestBrowserAKeyHeldByAFailedMessage follows an ordering key held by a
// failed message in headless Chromium, scripts off: the overview counts
// what is parked as the database does, a parked message's page names the
// message it waits for and links to it, that one's page says how many wait
// behind it, and skipping it (confirmed) lets the next one go, whose page
// no longer says it is parked.
func TestBrowserAKeyHeldByAFailedMessage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bctx, shot := headless(t, ctx, false)
	e := newEnv(t, token)
	base := e.srv.URL
	b := browserPage{t, bctx}
	do, attr, text := b.do, b.attr, b.text
	ep := e.endpoint(t, "http://127.0.0.1:9/keyed", "order.placed")
	const key = "order-held"
	ids := keyedBacklog(t, e, key)
	behind := func() int64 {
		return e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND ordering_key = $2
			AND status = 'pending' AND parked`, ep.ID, key)
	}

	signIn(t, b, base)
	do(chromedp.WaitReady(chromedp.ID("parked-count")))
	require.Equal(t, e.count(t, `SELECT count(*) FROM outbox_messages WHERE status = 'pending' AND parked`), b.number("#parked-count"),
		"the overview's parked count is the database's")
	require.Contains(t, text("#failed-"+ids[0].String()), "holds its key")
	shot("90-overview-key-held.png")

	// The last of the key: parked, behind the failed one, which it links to.
	do(chromedp.Navigate(base+"/ops/messages/"+ids[2].String()), chromedp.WaitReady(chromedp.ID("held-by")))
	require.Equal(t, "true", attr("#held-by", "data-parked"))
	require.Equal(t, ids[0].String(), text("#held-by-link"), "it names the message of its key that holds it")
	require.Equal(t, e.status(t, ids[0]), text("#held-by-status"))
	shot("91-message-parked.png")
	follow(t, bctx, chromedp.Click(chromedp.ID("held-by-link")))

	// The failed one: how many wait behind it, as the database says.
	do(chromedp.WaitReady(chromedp.ID("holding")))
	require.Equal(t, base+"/ops/messages/"+ids[0].String(), b.location())
	require.Equal(t, strconv.FormatInt(behind(), 10), attr("#holding", "data-holding"),
		"the page counts the messages parked behind it in the database")
	require.Contains(t, text("#holding"), "It holds its ordering key.")
	shot("92-message-holding-its-key.png")

	// Skip it: the next of the key is due, the last still waits for it.
	follow(t, bctx, chromedp.Click(chromedp.ID("skip")))
	do(chromedp.WaitReady(chromedp.ID("confirm")))
	require.Contains(t, text("main"), strconv.FormatInt(behind(), 10)+" later messages of its ordering key")
	require.Equal(t, outbox.StatusFailed, e.status(t, ids[0]), "nothing changes before the confirmation")
	follow(t, bctx, chromedp.Click(chromedp.ID("confirm")))
	do(chromedp.WaitReady(chromedp.ID("message-status")))
	require.Equal(t, outbox.StatusDiscarded, attr("#message-status", "data-status"))
	require.Equal(t, outbox.StatusDiscarded, e.status(t, ids[0]))
	require.Eventually(t, func() bool {
		return e.count(t, `SELECT count(*) FROM outbox_messages WHERE id = $1 AND status = 'pending' AND NOT parked`, ids[1]) == 1
	}, 10*time.Second, 20*time.Millisecond, "the next message of the key never became due")
	do(chromedp.Navigate(base+"/ops/messages/"+ids[1].String()), chromedp.WaitReady(chromedp.ID("message-status")))
	require.False(t, b.exists("#held-by"), "the next of the key is not parked any more")
	require.Equal(t, strconv.FormatInt(behind(), 10), attr("#holding", "data-holding"), "the last waits behind it now")
	shot("93-message-next-due.png")
}
