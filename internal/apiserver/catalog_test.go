package apiserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/events"
)

// GET /event-types lists the catalog, each type with what a receiver
// codes against; an admin route like the others.
func TestEventTypesListTheCatalog(t *testing.T) {
	t.Parallel()
	a := setupAdmin(t)
	resp, _ := send(t, http.MethodGet, a.s.url+"/event-types", nil, "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the catalog is an admin route")
	resp, body := send(t, http.MethodGet, a.s.url+"/event-types", a.auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var listed []struct {
		Type    string          `json:"type"`
		Version int             `json:"version"`
		Schema  json.RawMessage `json:"schema"`
		Example json.RawMessage `json:"example"`
	}
	require.NoError(t, json.Unmarshal(body, &listed))
	var names []string
	for _, et := range listed {
		names = append(names, et.Type)
		want, _ := events.Catalog().Lookup(et.Type)
		require.Equal(t, want.Version, et.Version)
		require.JSONEq(t, string(want.Schema), string(et.Schema), "%s: the catalog's schema", et.Type)
		require.JSONEq(t, string(want.Example), string(et.Example), "%s: the catalog's example", et.Type)
	}
	require.Equal(t, events.Catalog().Names(), names, "every type of the catalog, by name")
}

// A subscription names types of the catalog only: a typo would subscribe
// to nothing, silently and for good. POST and PATCH answer 422 naming the
// known types, and write nothing.
func TestSubscriptionsToUnknownTypesAreRefused(t *testing.T) {
	t.Parallel()
	a := setupAdmin(t)
	resp, body := a.post(t, "/webhook-endpoints", nil, `{"url":"http://127.0.0.1:9/hook","event_types":["order.placed","order.unknown"]}`)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, `event type "order.unknown" is not in the event catalog`)
	require.Contains(t, string(body), "order.cancelled, order.placed", "the detail lists the known types")
	require.Equal(t, counts{}, countRows(t, a.conn), "a refused endpoint writes nothing")

	resp, body = a.post(t, "/webhook-endpoints", nil, `{"url":"http://127.0.0.1:9/hook","event_types":["order.placed"]}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	ep := decodeEndpoint(t, body)
	resp, body = send(t, http.MethodPatch, a.s.url+"/webhook-endpoints/"+ep.ID, a.auth, `{"event_types":["order.placed","Order.Cancelled"]}`)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, `"Order.Cancelled" is not in the event catalog`)
	var types []string
	require.NoError(t, a.conn.QueryRow(context.Background(), `SELECT event_types FROM webhook_endpoints`).Scan(&types))
	require.Equal(t, []string{"order.placed"}, types, "a refused change changes nothing")
}

// An endpoint stored naming a type the catalog no longer has (a module
// stopped emitting it) keeps it: its other types are delivered as
// before, a change that leaves event_types out keeps it, and a change
// that names event_types must name known ones only, which is how it is
// dropped. The ops page lists it as subscribed but not in the catalog.
func TestAnEndpointKeepsATypeThatLeftTheCatalog(t *testing.T) {
	t.Parallel()
	a := setupAdmin(t)
	ctx := context.Background()
	var id string
	require.NoError(t, a.conn.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types)
		VALUES ('http://127.0.0.1:9/old', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', '{order.placed,order.returned}') RETURNING id::text`).Scan(&id))

	resp, body := send(t, http.MethodGet, a.s.url+"/webhook-endpoints/"+id, a.auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), `"event_types":["order.placed","order.returned"]`, "read as stored")

	resp, body = send(t, http.MethodPatch, a.s.url+"/webhook-endpoints/"+id, a.auth, `{"url":"http://127.0.0.1:9/new"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "a move that leaves the types alone is not refused for them: %s", body)
	require.Contains(t, string(body), `"event_types":["order.placed","order.returned"]`, "the move keeps the types")

	resp, body = send(t, http.MethodPost, a.s.url+"/orders", map[string]string{"Content-Type": "application/json"}, orderBody)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)
	var messages int
	require.NoError(t, a.conn.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND type = 'order.placed'`, id).Scan(&messages))
	require.Equal(t, 1, messages, "its known types are delivered as before")

	resp, body = send(t, http.MethodGet, a.s.url+"/ops/event-types", a.auth, "")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	page := string(body)
	require.Contains(t, page, `id="unknown-types"`, "the ops page lists the type")
	require.Contains(t, page[strings.Index(page, `id="unknown-types"`):], "order.returned")
	require.Contains(t, page, `id="type-order.placed"`, "and the catalog's types")

	resp, body = send(t, http.MethodPatch, a.s.url+"/webhook-endpoints/"+id, a.auth, `{"event_types":["order.placed","order.returned"]}`)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, `"order.returned" is not in the event catalog`)
	resp, body = send(t, http.MethodPatch, a.s.url+"/webhook-endpoints/"+id, a.auth, `{"event_types":["order.placed"]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), `"event_types":["order.placed"]`, "dropped by naming the types to keep")
}
