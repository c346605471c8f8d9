package apiserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/dbtest"
)

// adminAPI is an api with the admin API on a database the test reads.
type adminAPI struct {
	s    *server
	conn *pgx.Conn
	auth map[string]string
}

func setupAdmin(t *testing.T) adminAPI {
	t.Helper()
	dbURL := dbtest.URL(t)
	tok := strings.Repeat("k", 32)
	s := setup(t, map[string]string{"DATABASE_URL": dbURL, "ADMIN_TOKEN": tok, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return adminAPI{s: s, conn: conn, auth: map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}}
}

// post sends a POST with the admin token and the extra headers.
func (a adminAPI) post(t *testing.T, path string, headers map[string]string, body string) (*http.Response, []byte) {
	t.Helper()
	h := map[string]string{}
	for k, v := range a.auth {
		h[k] = v
	}
	for k, v := range headers {
		h[k] = v
	}
	return send(t, http.MethodPost, a.s.url+path, h, body)
}

// endpoint is what the admin API answers for an endpoint, as these tests
// read it.
type endpoint struct {
	ID                      string     `json:"id"`
	URL                     string     `json:"url"`
	Secret                  string     `json:"secret"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

func decodeEndpoint(t *testing.T, body []byte) endpoint {
	t.Helper()
	var ep endpoint
	require.NoError(t, json.Unmarshal(body, &ep), "body: %s", body)
	return ep
}

// POST /webhook-endpoints takes an Idempotency-Key as POST /orders does: the
// request sent again with its key (its answer was lost) gets the endpoint
// the first one made, with its secret, and makes no second endpoint whose
// secret nobody saw; the key reused for another request is a 422, and a
// key given twice or empty a 400, writing nothing.
func TestCreateEndpointWithAnIdempotencyKeyCreatesOnce(t *testing.T) {
	t.Parallel()
	a := setupAdmin(t)
	const create = `{"url":"http://127.0.0.1:9/hook","event_types":["order.placed"]}`
	key := map[string]string{"Idempotency-Key": "create-hook-1"}

	resp, body := a.post(t, "/webhook-endpoints", key, create)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", body)
	require.Empty(t, resp.Header.Get("Idempotent-Replayed"))
	first := decodeEndpoint(t, body)
	resp, body = a.post(t, "/webhook-endpoints", key, create)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", body)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the answer says it is the first request's")
	again := decodeEndpoint(t, body)
	require.Equal(t, first.ID, again.ID, "the retried creation answers with the endpoint the first made")
	require.Equal(t, first.Secret, again.Secret, "with its secret, which the client may never have seen")
	require.Equal(t, 1, countRows(t, a.conn).endpoints, "one endpoint for one key")

	resp, body = a.post(t, "/webhook-endpoints", key, `{"url":"http://127.0.0.1:9/other","event_types":["order.placed"]}`)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, "another destination or other event types")
	resp, body = a.post(t, "/webhook-endpoints", map[string]string{"Idempotency-Key": " "}, create)
	requireProblem(t, resp, body, http.StatusBadRequest, "Idempotency-Key must not be empty")
	resp, body = a.post(t, "/webhook-endpoints", map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, create)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, "Idempotency-Key must be UTF-8 text of at most 255 bytes")
	req, err := http.NewRequest(http.MethodPost, a.s.url+"/webhook-endpoints", strings.NewReader(create))
	require.NoError(t, err)
	for k, v := range a.auth {
		req.Header.Set(k, v)
	}
	req.Header.Add("Idempotency-Key", "k-1")
	req.Header.Add("Idempotency-Key", "k-2")
	twice, err := contracttest.Client(t, nil).Do(req)
	require.NoError(t, err)
	defer twice.Body.Close()
	body, err = io.ReadAll(twice.Body)
	require.NoError(t, err)
	requireProblem(t, twice, body, http.StatusBadRequest, "Idempotency-Key must be given at most once")
	require.Equal(t, 1, countRows(t, a.conn).endpoints, "refused requests wrote nothing")

	resp, body = a.post(t, "/webhook-endpoints", nil, create)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", body)
	require.NotEqual(t, first.ID, decodeEndpoint(t, body).ID, "without a key, every request creates")
}

// A rotation keeps every secret still inside its overlap: a second one
// while the first's overlap runs is refused with 409, saying until when,
// and changes nothing (it would drop the secret the receivers still use);
// the rotation sent again with its Idempotency-Key gets the first one's
// answer and secret; one with overlap 0 (a leaked secret) always goes.
func TestRotationKeepsEverySecretInsideItsOverlap(t *testing.T) {
	t.Parallel()
	a := setupAdmin(t)
	resp, body := a.post(t, "/webhook-endpoints", nil, `{"url":"http://127.0.0.1:9/hook","event_types":["order.placed"]}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body: %s", body)
	created := decodeEndpoint(t, body)
	rotate := "/webhook-endpoints/" + created.ID + "/rotate-secret"
	secrets := func() (current, previous string) {
		t.Helper()
		require.NoError(t, a.conn.QueryRow(context.Background(),
			`SELECT secret, COALESCE(previous_secret, '') FROM webhook_endpoints WHERE id = $1`, created.ID).Scan(&current, &previous))
		return current, previous
	}
	original, _ := secrets()

	key := map[string]string{"Idempotency-Key": "rotate-1"}
	resp, body = a.post(t, rotate, key, `{"overlap":"1h"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	rotated := decodeEndpoint(t, body)
	require.NotEqual(t, created.Secret, rotated.Secret)
	require.NotNil(t, rotated.PreviousSecretExpiresAt)
	current, previous := secrets()

	// Its answer lost, the client sends it again.
	resp, body = a.post(t, rotate, key, `{"overlap":"1h"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	require.Equal(t, rotated.Secret, decodeEndpoint(t, body).Secret, "the retry shows the rotation's secret, and rotates nothing")
	resp, body = a.post(t, rotate, key, `{"overlap":"2h"}`)
	requireProblem(t, resp, body, http.StatusUnprocessableEntity, "another overlap")

	// A second operator, or a retry without a key.
	resp, body = a.post(t, rotate, nil, `{"overlap":"1h"}`)
	requireProblem(t, resp, body, http.StatusConflict, "previous secret signs until "+rotated.PreviousSecretExpiresAt.UTC().Format(time.RFC3339))
	resp, body = a.post(t, rotate, map[string]string{"Idempotency-Key": "rotate-2"}, "")
	requireProblem(t, resp, body, http.StatusConflict, "previous secret signs until")
	nowCurrent, nowPrevious := secrets()
	require.Equal(t, current, nowCurrent, "refused rotations change nothing")
	require.Equal(t, previous, nowPrevious, "the secret the receivers used before the rotation still signs")
	require.Equal(t, original, nowPrevious)

	resp, body = a.post(t, rotate, nil, `{"overlap":"0s"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "overlap 0 ends every earlier secret at once, overlap or not: %s", body)
	require.NotEqual(t, rotated.Secret, decodeEndpoint(t, body).Secret)
	resp, body = a.post(t, rotate, nil, `{"overlap":"1h"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "no overlap runs after one of 0: %s", body)
}
