package apiserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/apiserver"
	"github.com/outboxkit/orders/internal/contracttest"
	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/events/eventstest"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/proctest"
)

// closedDB is a well-formed URL nobody listens on: with it, a config error
// and a connection error are told apart by the message.
const closedDB = "postgres://x@127.0.0.1:1/db"

const adminToken = "secret-token"

// server is one api started in-process by apiserver.Run.
type server struct {
	url  string
	logs *proctest.Output

	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
	stopErr  error
}

// setup starts the api with env (plus a fresh database, a free port and JSON
// logs unless env sets them) and returns once /readyz answers 200. The api is
// stopped when the test ends, if the test has not stopped it.
func setup(t *testing.T, env map[string]string) *server {
	t.Helper()
	full := map[string]string{"API_ADDR": proctest.FreeAddr(t), "LOG_FORMAT": "json"}
	for k, v := range env {
		full[k] = v
	}
	if full["DATABASE_URL"] == "" {
		full["DATABASE_URL"] = dbtest.URL(t)
	}
	eventstest.CheckEvents(t, full["DATABASE_URL"])
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{url: "http://" + full["API_ADDR"], logs: &proctest.Output{}, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- apiserver.Run(ctx, nil, proctest.Environ(full), s.logs) }()
	t.Cleanup(func() { _ = s.stop() })

	var exited error
	client := contracttest.Client(t, &http.Client{Timeout: time.Second})
	require.Eventually(t, func() bool {
		select {
		case err := <-s.done:
			exited = fmt.Errorf("run returned early: %v", err)
			s.done <- err
			return true
		default:
		}
		resp, err := client.Get(s.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "api never became ready")
	require.NoError(t, exited, "logs:\n%s", s.logs.String())
	return s
}

// stop cancels Run's context, as SIGTERM does, and returns Run's error; it
// reports an error of its own if Run does not return within 5 s.
func (s *server) stop() error {
	s.stopOnce.Do(func() {
		s.cancel()
		select {
		case s.stopErr = <-s.done:
		case <-time.After(5 * time.Second):
			s.stopErr = errors.New("run did not return within 5s of cancellation")
		}
	})
	return s.stopErr
}

// do sends a request and returns the status and body. authz is the
// Authorization header ("" sends none).
func (s *server) do(t *testing.T, method, path, authz, body string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.url+path, r)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := contracttest.Client(t, &http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"log format", map[string]string{"LOG_FORMAT": "xml"}, []string{"LOG_FORMAT"}},
		{"allow private targets", map[string]string{"OUTBOX_ALLOW_PRIVATE_TARGETS": "maybe"}, []string{"OUTBOX_ALLOW_PRIVATE_TARGETS"}},
		{"malformed database url", map[string]string{"DATABASE_URL": "postgres://%zz"}, []string{"DATABASE_URL"}},
		// A production process never guesses a database (cmd/dev does).
		{"no database url", map[string]string{"DATABASE_URL": ""}, []string{"DATABASE_URL: required"}},
		{"every problem at once", map[string]string{"LOG_FORMAT": "xml", "OUTBOX_ALLOW_PRIVATE_TARGETS": "maybe"},
			[]string{"LOG_FORMAT", "OUTBOX_ALLOW_PRIVATE_TARGETS"}},
		// A short admin token where the admin routes listen beyond loopback.
		{"short token on all interfaces", map[string]string{"API_ADDR": "0.0.0.0:0", "ADMIN_TOKEN": "a"}, []string{"ADMIN_TOKEN", "32 characters"}},
		{"short token on an empty host", map[string]string{"API_ADDR": ":0", "ADMIN_TOKEN": strings.Repeat("a", 31)}, []string{"ADMIN_TOKEN"}},
		{"short token on a host name", map[string]string{"API_ADDR": "api.internal:0", "ADMIN_TOKEN": "a"}, []string{"ADMIN_TOKEN"}},
		{"short token on a public admin addr", map[string]string{"ADMIN_ADDR": "0.0.0.0:0", "ADMIN_TOKEN": "a"}, []string{"ADMIN_TOKEN"}},
		{"admin addr same as api addr", map[string]string{"ADMIN_ADDR": "127.0.0.1:0"}, []string{"ADMIN_ADDR"}},
		// A token read from a file with its newline: no request could present it.
		{"token with a newline", map[string]string{"ADMIN_TOKEN": strings.Repeat("k", 32) + "\n"}, []string{"ADMIN_TOKEN", "whitespace"}},
		// A URL where a host name belongs would match no Host header.
		{"allowed host with a scheme", map[string]string{"API_ALLOWED_HOSTS": "https://api.example.com"}, []string{"API_ALLOWED_HOSTS"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"DATABASE_URL": closedDB, "API_ADDR": "127.0.0.1:0"}
			for k, v := range tc.env {
				env[k] = v
			}
			var out proctest.Output
			err := apiserver.Run(context.Background(), nil, proctest.Environ(env), &out)
			require.Error(t, err)
			require.ErrorContains(t, err, "invalid configuration")
			for _, name := range tc.want {
				require.ErrorContains(t, err, name)
			}
			require.NotContains(t, err.Error(), "connecting to database")
			require.Empty(t, out.String(), "nothing should happen before the configuration is valid")
		})
	}

	// The control: valid settings with the same unreachable database fail
	// differently, so the rows above did fail on configuration.
	for name, env := range map[string]map[string]string{
		"valid config reaches the database": {},
		// The admin token rule's controls: long enough anywhere, or short
		// where the admin routes listen on loopback only.
		"long token on all interfaces":            {"API_ADDR": "0.0.0.0:0", "ADMIN_TOKEN": strings.Repeat("a", 32)},
		"short token on localhost":                {"API_ADDR": "localhost:0", "ADMIN_TOKEN": "a"},
		"short token on IPv6 loopback":            {"API_ADDR": "[::1]:0", "ADMIN_TOKEN": "a"},
		"short token, public api, loopback admin": {"API_ADDR": "0.0.0.0:0", "ADMIN_ADDR": "127.0.0.1:1", "ADMIN_TOKEN": "a"},
		"no token on all interfaces":              {"API_ADDR": "0.0.0.0:0"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			full := map[string]string{"DATABASE_URL": closedDB, "API_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json"}
			for k, v := range env {
				full[k] = v
			}
			err := apiserver.Run(context.Background(), nil, proctest.Environ(full), io.Discard)
			require.ErrorContains(t, err, "connecting to database")
			require.NotContains(t, err.Error(), "invalid configuration")
		})
	}
}

// A misspelt setting is named with the one meant, before anything else
// happens, and does not stop the api; the worker's settings, in an
// environment both share, are not taken for misspellings.
func TestAMisspeltSettingIsNamed(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": closedDB, "API_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json",
		"OUTBOX_NOTIFI": "true", "ADMIN_TOKN": "t",
		"WORKER_ADDR": "127.0.0.1:0", "OUTBOX_DELIVERY_TIMEOUT": "30s", "OUTBOX_MAX_ATTEMPTS": "20", "WORKER_SHUTDOWN_GRACE": "5s"}
	var out proctest.Output
	err := apiserver.Run(context.Background(), nil, proctest.Environ(env), &out)
	require.ErrorContains(t, err, "connecting to database")
	proctest.RequireMisspelt(t, out.String(),
		"OUTBOX_NOTIFI is set but nothing reads it: did you mean OUTBOX_NOTIFY?",
		"ADMIN_TOKN is set but nothing reads it: did you mean ADMIN_TOKEN?")
}

// emptyDatabase creates a database with no schema at all, dropped at the end.
func emptyDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbtest.ServerURL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	name := fmt.Sprintf("test_empty_%d", time.Now().UnixNano())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dbtest.ServerURL())
		if err != nil {
			t.Errorf("connecting to drop %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
	u, err := url.Parse(dbtest.ServerURL())
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  func(testing.TB) string
		// applies is how many summary lines the first migrate says: a
		// test database comes migrated.
		applies int
	}{
		{"fresh test database", dbtest.URL, 0},
		{"empty database", emptyDatabase, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := tc.url(t)
			env := proctest.Environ(map[string]string{"DATABASE_URL": dbURL, "LOG_FORMAT": "json"})

			var first, second proctest.Output
			require.NoError(t, apiserver.Run(context.Background(), []string{"migrate"}, env, &first))
			require.NoError(t, apiserver.Run(context.Background(), []string{"migrate"}, env, &second))
			proctest.RequireJSONLogs(t, first.String())
			require.Equal(t, tc.applies, strings.Count(first.String(), `"msg":"applied migrations"`),
				"one line says what a migrate applied, not one per file:\n%s", first.String())
			require.NotContains(t, first.String(), `"msg":"applied migration"`, "each file is said at debug only")
			require.NotContains(t, second.String(), "applied migration", "a second migrate must apply nothing")
			require.Contains(t, second.String(), "database is up to date")

			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dbURL)
			require.NoError(t, err)
			defer conn.Close(ctx)
			for _, table := range []string{"orders", "order_lines", "webhook_endpoints", "outbox_messages", "river_job"} {
				var exists bool
				require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists))
				require.Truef(t, exists, "table %s is missing after migrate", table)
			}
			var versions int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM goose_db_version").Scan(&versions))
			require.Positive(t, versions)
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	env := proctest.Environ(map[string]string{"DATABASE_URL": dbtest.URL(t), "LOG_FORMAT": "json"})
	err := apiserver.Run(context.Background(), []string{"frobnicate"}, env, io.Discard)
	require.ErrorContains(t, err, "unknown command")
	require.ErrorContains(t, err, "frobnicate")
}

func TestServe(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"ADMIN_TOKEN": adminToken, "OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	bearer := "Bearer " + adminToken

	t.Run("ops", func(t *testing.T) {
		code, _ := s.do(t, http.MethodGet, "/healthz", "", "")
		require.Equal(t, http.StatusOK, code)
		code, body := s.do(t, http.MethodGet, "/metrics", bearer, "")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, string(body), "outbox_messages")
		require.Contains(t, string(body), "outbox_oldest_pending_age_seconds")
		// The request above is counted under its route pattern, and the
		// api's pool reports its connections.
		require.Contains(t, string(body), `http_requests_total{code="200",method="GET",route="GET /healthz"} 1`)
		require.Contains(t, string(body), `pgxpool_connections{pool="api",state="idle"}`)
		require.Contains(t, string(body), `pgxpool_max_connections{pool="api_admin"} 2`, "the admin surface's own pool")
	})

	t.Run("admin auth", func(t *testing.T) {
		tests := []struct {
			name  string
			authz string
			want  int
		}{
			{"no authorization", "", http.StatusUnauthorized},
			{"wrong token", "Bearer nope", http.StatusUnauthorized},
			{"token prefix", "Bearer " + adminToken[:5], http.StatusUnauthorized},
			{"right token, wrong scheme", "Basic " + adminToken, http.StatusUnauthorized},
			{"right token", bearer, http.StatusOK},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				code, body := s.do(t, http.MethodGet, "/outbox/stats", tc.authz, "")
				require.Equal(t, tc.want, code, "body: %s", body)
				if tc.want != http.StatusOK {
					return
				}
				var stats map[string]any
				require.NoError(t, json.Unmarshal(body, &stats))
				for _, field := range []string{"pending", "claimed", "delivered", "failed", "oldest_pending_age_seconds"} {
					require.Contains(t, stats, field)
				}
			})
		}
	})

	t.Run("webhook endpoints", func(t *testing.T) {
		target := "http://127.0.0.1:9/hooks"
		code, body := s.do(t, http.MethodPost, "/webhook-endpoints", bearer,
			`{"url":"`+target+`","event_types":["order.placed"]}`)
		require.Equal(t, http.StatusCreated, code, "body: %s", body)
		var created struct {
			ID         string   `json:"id"`
			URL        string   `json:"url"`
			EventTypes []string `json:"event_types"`
			Secret     string   `json:"secret"`
		}
		require.NoError(t, json.Unmarshal(body, &created))
		require.NotEmpty(t, created.ID)
		require.Equal(t, target, created.URL)
		require.Equal(t, []string{"order.placed"}, created.EventTypes)
		require.True(t, strings.HasPrefix(created.Secret, "whsec_"), "secret %q", created.Secret)

		code, body = s.do(t, http.MethodGet, "/webhook-endpoints", bearer, "")
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, string(body), created.Secret)
		var listed []map[string]any
		require.NoError(t, json.Unmarshal(body, &listed))
		require.Len(t, listed, 1)
		require.Equal(t, created.ID, listed[0]["id"])
		require.NotContains(t, listed[0], "secret")

		code, body = s.do(t, http.MethodGet, "/webhook-endpoints/"+created.ID, bearer, "")
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, string(body), created.Secret)

		require.NotContains(t, s.logs.String(), created.Secret, "the secret must never be logged")
	})

	t.Run("relays", func(t *testing.T) {
		// No worker runs: the relay is down, and the placed order's message
		// (to the endpoint registered above) is due.
		code, body := s.do(t, http.MethodPost, "/orders", "",
			`{"customer_id":"c-1","lines":[{"sku":"A-1","quantity":1,"unit_price_cents":500}]}`)
		require.Equal(t, http.StatusCreated, code, "body: %s", body)
		code, _ = s.do(t, http.MethodGet, "/outbox/relays", "", "")
		require.Equal(t, http.StatusUnauthorized, code, "the relays are an admin route")
		code, body = s.do(t, http.MethodGet, "/outbox/relays", bearer, "")
		require.Equal(t, http.StatusOK, code, "body: %s", body)
		var relays struct {
			State                 string  `json:"state"`
			Reason                string  `json:"reason"`
			Alive                 int     `json:"alive"`
			Relays                []any   `json:"relays"`
			Due                   int64   `json:"due"`
			Scheduled             int64   `json:"scheduled"`
			StallThresholdSeconds float64 `json:"stall_threshold_seconds"`
		}
		require.NoError(t, json.Unmarshal(body, &relays))
		require.Equal(t, admin.RelayDown, relays.State)
		require.Contains(t, relays.Reason, "No worker has sent a heartbeat")
		require.Zero(t, relays.Alive)
		require.Empty(t, relays.Relays)
		require.Equal(t, int64(1), relays.Due, "the order's one message, due at once")
		require.Zero(t, relays.Scheduled)
		require.Equal(t, admin.DefaultStallThreshold.Seconds(), relays.StallThresholdSeconds)
	})

	t.Run("admin token never logged", func(t *testing.T) {
		// Every admin request above carried it, right and wrong.
		require.NotContains(t, s.logs.String(), adminToken)
	})

	require.NoError(t, s.stop())
	proctest.RequireJSONLogs(t, s.logs.String())
}

func TestAdminClosedWithoutToken(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"OUTBOX_ALLOW_PRIVATE_TARGETS": "true"})
	tests := []struct {
		method, path, authz, body string
	}{
		{http.MethodGet, "/outbox/stats", "", ""},
		{http.MethodGet, "/outbox/stats", "Bearer ", ""},
		{http.MethodGet, "/outbox/stats", "Bearer " + adminToken, ""},
		{http.MethodGet, "/outbox/messages?status=failed", "", ""},
		{http.MethodGet, "/webhook-endpoints", "", ""},
		{http.MethodPost, "/webhook-endpoints", "Bearer ", `{"url":"http://127.0.0.1:9/x","event_types":["order.placed"]}`},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path+" "+tc.authz, func(t *testing.T) {
			code, body := s.do(t, tc.method, tc.path, tc.authz, tc.body)
			require.Equal(t, http.StatusForbidden, code, "body: %s", body)
		})
	}
	// The orders API stays open.
	code, _ := s.do(t, http.MethodGet, "/healthz", "", "")
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, s.stop())
}

func TestRegisterRefusesPrivateTargets(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"ADMIN_TOKEN": adminToken})
	bearer := "Bearer " + adminToken
	for _, target := range []string{"http://127.0.0.1:9/x", "http://10.0.0.1/x", "http://169.254.169.254/latest"} {
		t.Run(target, func(t *testing.T) {
			code, body := s.do(t, http.MethodPost, "/webhook-endpoints", bearer,
				`{"url":"`+target+`","event_types":["order.placed"]}`)
			require.Equal(t, http.StatusUnprocessableEntity, code, "body: %s", body)
		})
	}
	code, body := s.do(t, http.MethodGet, "/webhook-endpoints", bearer, "")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `[]`, string(body), "a refused endpoint must not be stored")
	require.NoError(t, s.stop())
}
