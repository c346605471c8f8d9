package ops_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// What each endpoint is doing now, on the overview and on its own page,
// with a real relay delivering to real receivers: one answering 422 to
// everything keeps its circuit closed, but every message of it waits out
// its retry, so it is "backing off" with its next attempt as the database
// has it, not green; one failing as a whole has its circuit open until its
// next probe; a paused one is paused; a healthy one is delivering.
func TestEndpointsShowWhatTheyAreDoingNow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx := context.Background()
	receiver := func(status int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
		t.Cleanup(srv.Close)
		return srv.URL + "/hook"
	}
	good := e.endpoint(t, receiver(http.StatusNoContent), "order.placed")
	refusing := e.endpoint(t, receiver(http.StatusUnprocessableEntity), "order.placed")
	off := e.endpoint(t, receiver(http.StatusNoContent), "order.placed")
	_, err := e.admin.SetEndpointEnabled(ctx, off.ID, false)
	require.NoError(t, err)
	// Failing as a whole, its next probe 10 minutes away: the relay leaves
	// it alone meanwhile.
	down := e.endpoint(t, "http://127.0.0.1:9/down", "order.placed")
	e.exec(t, `UPDATE webhook_endpoints SET health = 'backing_off', health_reason = 'connect: connection refused',
		health_changed_at = now(), consecutive_failures = 5, backoff_until = now() + interval '10 minutes' WHERE id = $1`, down.ID)
	require.Len(t, e.enqueue(t, "order.placed", 1), 4, "one message for each endpoint")

	relay, err := relay.New(e.pool, relay.Config{RetrySchedule: []time.Duration{time.Hour}},
		&relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()}, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	require.NoError(t, relay.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = relay.Stop(sctx)
	})
	require.Eventually(t, func() bool {
		return e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'delivered'`, good.ID) == 1 &&
			e.count(t, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND status = 'pending' AND attempts = 1`, refusing.ID) == 1
	}, 20*time.Second, 20*time.Millisecond, "the good receiver got its message and the refusing one refused its")

	// The next attempts as PostgreSQL has them: the refused message's retry
	// (no backoff holds that endpoint), and the probe of the one down.
	at := func(sql string, id uuid.UUID) string {
		var t0 time.Time
		require.NoError(t, e.pool.QueryRow(ctx, sql, id).Scan(&t0))
		return t0.UTC().Format(time.RFC3339Nano)
	}
	retryAt := at(`SELECT min(next_attempt_at) FROM outbox_messages WHERE destination = $1 AND status = 'pending' AND NOT parked`, refusing.ID)
	probeAt := at(`SELECT GREATEST(backoff_until, (SELECT min(next_attempt_at) FROM outbox_messages
		WHERE destination = $1 AND status = 'pending' AND NOT parked)) FROM webhook_endpoints WHERE id = $1`, down.ID)

	c := e.loggedIn(t)
	_, body := get(t, c, e.srv.URL+"/ops")
	require.Contains(t, body, `data-state="running"`, "a relay runs, so each endpoint says what it is doing")
	row := func(id uuid.UUID) string {
		i := strings.Index(body, `id="endpoint-`+id.String()+`"`)
		require.Positive(t, i)
		j := strings.Index(body[i:], "</tr>")
		return body[i : i+j]
	}
	require.Contains(t, row(good.ID), `data-delivery-state="delivering"`)
	require.Contains(t, row(good.ID), `health-healthy`)
	require.Contains(t, row(refusing.ID), `data-health="healthy" data-delivery-state="retrying"`, "the circuit is closed")
	require.Contains(t, row(refusing.ID), `<span class="health health-backing-off">backing off</span>`)
	require.NotContains(t, row(refusing.ID), `health-healthy`, "not green while nothing of it is delivered")
	require.Contains(t, row(refusing.ID), `data-at="`+retryAt+`"`)
	require.Regexp(t, `1 retrying, next attempt in (5[4-9]m|1h 0[0-6]m)`, row(refusing.ID), "the hour's retry, ±10%")
	require.Contains(t, row(off.ID), `data-delivery-state="paused"`)
	require.NotContains(t, row(off.ID), `next-attempt`, "a paused endpoint is not tried")
	require.Contains(t, row(down.ID), `data-delivery-state="circuit_open"`)
	require.Contains(t, row(down.ID), `data-at="`+probeAt+`"`)
	require.Regexp(t, `next probe in (9m 5\d|10m 00)s`, row(down.ID))

	page := func(id uuid.UUID) string {
		res, body := get(t, c, e.srv.URL+"/ops/endpoints/"+id.String())
		require.Equal(t, http.StatusOK, res.StatusCode)
		return body
	}
	body = page(refusing.ID)
	require.Contains(t, body, `id="endpoint-state" data-state="healthy" data-delivery-state="retrying"`)
	require.Contains(t, body, `<span class="health health-backing-off">backing off</span>`)
	require.Contains(t, body, `<time datetime="`+retryAt+`" id="next-attempt"`)
	body = page(down.ID)
	require.Contains(t, body, `data-delivery-state="circuit_open"`)
	require.Contains(t, body, `<time datetime="`+probeAt+`" id="next-probe"`)
	body = page(off.ID)
	require.Contains(t, body, `data-delivery-state="paused"`)
	require.NotContains(t, body, `id="next-attempt"`)
	body = page(good.ID)
	require.Contains(t, body, `data-delivery-state="delivering"`)
	require.Contains(t, body, `<span class="health health-healthy">delivering</span>`)

	// A message's page names its endpoint's state as the overview does.
	messagePage := func(dest uuid.UUID) string {
		var id uuid.UUID
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE destination = $1`, dest).Scan(&id))
		res, body := get(t, c, e.srv.URL+"/ops/messages/"+id.String())
		require.Equal(t, http.StatusOK, res.StatusCode)
		return body
	}
	require.Contains(t, messagePage(refusing.ID), `<span class="health health-backing-off">backing off</span>`)
	require.Contains(t, messagePage(down.ID), `<span class="health health-backing-off">circuit open</span>`)
}
