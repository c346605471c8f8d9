package relayworker_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
)

// With OUTBOX_NOTIFY=true on both programs, an order is delivered at its
// commit: well before the worker's next poll, set long here to tell them
// apart.
func TestNotifyDeliversAtCommit(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.URL(t)
	rec := newReceiver(t)
	api := startAPI(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": adminToken,
		"OUTBOX_ALLOW_PRIVATE_TARGETS": "true", "OUTBOX_NOTIFY": "true"})
	env := relayEnv(dbURL)
	// A poll far longer than the wait below: whatever is delivered in
	// time was woken by the NOTIFY, however loaded the machine.
	env["OUTBOX_POLL_INTERVAL"] = "1m"
	env["OUTBOX_NOTIFY"] = "true"
	startWorker(t, env)
	register(t, api, rec, "order.placed")
	// The worker is ready before its listener has connected: wait until
	// PostgreSQL shows the LISTEN, or the first order may wait for the poll.
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query ILIKE 'LISTEN %'`).Scan(&n))
		return n > 0
	}, 30*time.Second, 10*time.Millisecond, "the worker never LISTENed")

	for range 3 {
		// Counted before the order: its delivery may arrive before the
		// api's answer does.
		before := len(delivered(rec))
		placed := time.Now()
		code, body := api.call(t, http.MethodPost, "/orders", "",
			`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
		require.Equal(t, http.StatusCreated, code, "body: %s", body)
		require.Eventually(t, func() bool { return len(delivered(rec)) == before+1 }, 20*time.Second, 5*time.Millisecond,
			"delivered at commit, not at the poll a minute away")
		t.Logf("order %d delivered %s after it was placed", len(delivered(rec)), time.Since(placed).Round(time.Millisecond))
	}
}

func delivered(rec *receiver) map[string]delivery {
	d, _, _ := rec.snapshot()
	return d
}

// The admin routes of events: messages found by event id, an endpoint
// changed in place (PATCH), a replay counted then run, a failed message
// skipped.
func TestEventAdminRoutes(t *testing.T) {
	t.Parallel()
	api, _, rec := setup(t, map[string]string{"OUTBOX_MAX_ATTEMPTS": "1"})
	rec.setStatus(http.StatusUnprocessableEntity) // every message fails at once
	start := time.Now().Add(-time.Second)
	// Two orders before anyone subscribes: recorded, sent to nobody.
	for range 2 {
		code, body := api.call(t, http.MethodPost, "/orders", "",
			`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
		require.Equal(t, http.StatusCreated, code, "body: %s", body)
	}
	var ep struct {
		ID         string   `json:"id"`
		Secret     string   `json:"secret"`
		EventTypes []string `json:"event_types"`
	}
	require.Equal(t, http.StatusCreated, api.admin(t, http.MethodPost, "/webhook-endpoints",
		`{"url":"`+rec.URL+`/old","event_types":["order.cancelled"]}`, &ep))
	rec.setSecret(t, ep.Secret)

	// PATCH: the new URL and types, same id.
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodPatch, "/webhook-endpoints/"+ep.ID,
		`{"url":"`+rec.URL+`/hooks","event_types":["order.placed","order.cancelled"]}`, &ep))
	require.Equal(t, []string{"order.cancelled", "order.placed"}, ep.EventTypes)
	require.Equal(t, http.StatusUnprocessableEntity, api.admin(t, http.MethodPatch, "/webhook-endpoints/"+ep.ID,
		`{"event_types":[]}`, nil), "an endpoint subscribes to something")
	require.Equal(t, http.StatusUnprocessableEntity, api.admin(t, http.MethodPatch, "/webhook-endpoints/"+ep.ID,
		`{"urll":"x"}`, nil), "unknown fields are refused")
	for _, body := range []string{`{}`, `{"event_types":null}`, `{"url":""}`, `{"url":"","event_types":["order.placed"]}`, `{"kind":"nats"}`} {
		require.Equal(t, http.StatusUnprocessableEntity, api.admin(t, http.MethodPatch, "/webhook-endpoints/"+ep.ID, body, nil),
			"%s changes nothing, or to nowhere", body)
	}

	// Replay: a dry run counts, the run replays.
	rng := fmt.Sprintf(`"from":%q,"to":%q`, start.UTC().Format(time.RFC3339Nano), time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano))
	var count struct{ Events int64 }
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodPost, "/webhook-endpoints/"+ep.ID+"/replay", `{`+rng+`,"dry_run":true}`, &count))
	require.EqualValues(t, 2, count.Events)
	var res struct {
		Read, Replayed int
		Next           *string
	}
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodPost, "/webhook-endpoints/"+ep.ID+"/replay", `{`+rng+`}`, &res))
	require.Equal(t, 2, res.Replayed)
	require.Nil(t, res.Next)
	require.Equal(t, http.StatusUnprocessableEntity, api.admin(t, http.MethodPost, "/webhook-endpoints/"+ep.ID+"/replay",
		`{"from":"2026-01-02T00:00:00Z","to":"2026-01-01T00:00:00Z"}`, nil), "a reversed range")

	// Both fail (the receiver refuses everything, one attempt allowed).
	var failed []message
	require.Eventually(t, func() bool {
		code, err := api.tryAdmin(http.MethodGet, "/outbox/messages?status=failed", "", &failed)
		return err == nil && code == http.StatusOK && len(failed) == 2
	}, 30*time.Second, 20*time.Millisecond)
	var byEvent []message
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodGet, "/outbox/messages?event_id="+url.QueryEscape(failed[0].EventID), "", &byEvent))
	require.Len(t, byEvent, 1)
	require.Equal(t, failed[0].ID, byEvent[0].ID)

	// Skip one: discarded, never sent again; skipping twice conflicts.
	var skipped message
	require.Equal(t, http.StatusOK, api.admin(t, http.MethodPost, "/outbox/messages/"+failed[0].ID+"/skip", "", &skipped))
	require.Equal(t, "discarded", skipped.Status)
	require.Equal(t, http.StatusConflict, api.admin(t, http.MethodPost, "/outbox/messages/"+failed[0].ID+"/skip", "", nil))
	require.Equal(t, http.StatusNotFound, api.admin(t, http.MethodPost, "/outbox/messages/not-an-id/skip", "", nil))
}
