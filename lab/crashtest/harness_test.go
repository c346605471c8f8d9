package crashtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/proctest"
)

// adminToken is the api's bearer token in these tests; the suite checks it
// never reaches a log.
const adminToken = "crashtest-admin-token-7f3a"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds api, worker and consumer once per test binary, with
// `go build`, exactly as a deployment would.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "outboxkit-crashtest-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+string(filepath.Separator),
			"github.com/outboxkit/orders/cmd/api",
			"github.com/outboxkit/orders/cmd/worker",
			"github.com/outboxkit/orders/cmd/consumer").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binDir
}

// service is one program run as a child process on a fixed address, so a
// restarted instance is where the old one was. A supervisor restarts it
// whenever it exits until the test stops it: after a SIGKILL of ours, or
// after an exit of its own, which is counted as unexpected.
type service struct {
	name string
	bin  string
	addr string // host:port of its HTTP server, for /readyz
	env  []string
	logs *proctest.Output

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	killing    bool
	stopping   bool
	starts     int
	kills      int
	unexpected []string // how each unexpected exit ended

	supervised chan struct{} // closed when the supervisor returns
}

func newService(t *testing.T, name, bin, addr string, env map[string]string) *service {
	t.Helper()
	full := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(), "LOG_FORMAT=json"}
	for k, v := range env {
		full = append(full, k+"="+v)
	}
	return &service{name: name, bin: bin, addr: addr, env: full, logs: &proctest.Output{}, supervised: make(chan struct{})}
}

// launch starts one instance of the program.
func (s *service) launch() error {
	cmd := exec.Command(s.bin)
	cmd.Env = s.env
	cmd.Stdout = s.logs
	cmd.Stderr = s.logs
	// If the test binary dies, its children die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(s.logs, "### %s: start %d\n", s.name, s.starts+1)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.name, err)
	}
	exited := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.starts++
	s.killing = false
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(s.logs, "### %s: exited: %v\n", s.name, err)
		s.mu.Lock()
		if !s.killing && !s.stopping {
			s.unexpected = append(s.unexpected, fmt.Sprint(err))
		}
		s.mu.Unlock()
		close(exited)
	}()
	return nil
}

// supervise launches the program and relaunches it after every exit, after
// restartDelay, until stop.
func (s *service) supervise(restartDelay func() time.Duration) error {
	if err := s.launch(); err != nil {
		return err
	}
	go func() {
		defer close(s.supervised)
		for {
			s.mu.Lock()
			exited := s.exited
			s.mu.Unlock()
			<-exited
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping {
				return
			}
			time.Sleep(restartDelay()) // a restart delay, not a wait for a condition
			if err := s.launch(); err != nil {
				fmt.Fprintf(s.logs, "### %s: relaunch failed: %v\n", s.name, err)
				return
			}
		}
	}()
	return nil
}

// start launches the program once, without a supervisor: a kill is final.
func (s *service) start() error {
	if err := s.launch(); err != nil {
		return err
	}
	close(s.supervised)
	return nil
}

// pid is the running instance's process id.
func (s *service) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// kill SIGKILLs the running instance, which the supervisor then restarts,
// and waits until it is gone. It reports whether there was one to kill.
func (s *service) kill() bool {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	select {
	case <-exited:
		s.mu.Unlock()
		return false // between instances
	default:
	}
	s.killing = true
	s.kills++
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return true
}

// stop ends supervision and SIGTERMs the running instance; after grace it
// SIGKILLs it.
func (s *service) stop(grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	select {
	case <-s.supervised:
	case <-time.After(5 * time.Second):
	}
}

// ready reports whether the running instance answers /readyz with 200.
func (s *service) ready() bool {
	code, _, err := request(http.MethodGet, "http://"+s.addr+"/readyz", "", nil, nil)
	return err == nil && code == http.StatusOK
}

func (s *service) waitReady(t *testing.T) {
	t.Helper()
	require.Eventually(t, s.ready, 60*time.Second, 20*time.Millisecond,
		"%s never became ready; logs:\n%s", s.name, tail(s.logs.String(), 4000))
}

func (s *service) counts() (starts, kills int, unexpected []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.kills, append([]string(nil), s.unexpected...)
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// request sends a JSON request and returns the status and body.
func request(method, url, body string, header http.Header, out any) (int, []byte, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, b, fmt.Errorf("decoding %s: %w", b, err)
		}
	}
	return resp.StatusCode, b, nil
}

func bearer() http.Header { return http.Header{"Authorization": {"Bearer " + adminToken}} }

// register subscribes url to the orders module's events, order.placed and
// order.cancelled, on the api and returns the endpoint's id and secret.
// register subscribes a destination (its JSON fields: a url, or a kind
// and its name) to both order events.
func register(t *testing.T, apiURL, destination string) (id, secret string) {
	t.Helper()
	var ep struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	code, body, err := request(http.MethodPost, apiURL+"/webhook-endpoints",
		`{`+destination+`,"event_types":["order.placed","order.cancelled"]}`, bearer(), &ep)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, code, "body: %s", body)
	return ep.ID, ep.Secret
}

// outboxStats is GET /outbox/stats.
type outboxStats struct {
	Pending, Claimed, Delivered, Failed int64
	OldestPendingAgeSeconds             float64 `json:"oldest_pending_age_seconds"`
}

func getStats(apiURL string) (outboxStats, error) {
	var s outboxStats
	code, body, err := request(http.MethodGet, apiURL+"/outbox/stats", "", bearer(), &s)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /outbox/stats: %d %s", code, body)
	}
	return s, err
}

// placedOrder is what POST /orders answered.
type placedOrder struct {
	ID         string `json:"id"`
	CustomerID string `json:"customer_id"`
	TotalCents int64  `json:"total_cents"`
}

// placeOrder POSTs an order with an Idempotency-Key, retrying with the same
// key through api restarts and cut connections until it gets an answer or
// the deadline passes: a retry after an api killed mid-request either
// replays the committed order or places it, never both.
func placeOrder(ctx context.Context, apiURL, key, body string, deadline time.Time) (placedOrder, error) {
	h := http.Header{"Idempotency-Key": {key}}
	var lastErr error
	for time.Now().Before(deadline) {
		var o placedOrder
		code, b, err := request(http.MethodPost, apiURL+"/orders", body, h, &o)
		switch {
		case err == nil && code == http.StatusCreated:
			return o, nil
		case err == nil && code < 500:
			return placedOrder{}, fmt.Errorf("POST /orders: %d %s", code, b)
		case err != nil:
			lastErr = err
		default:
			lastErr = fmt.Errorf("POST /orders: %d %s", code, b)
		}
		select {
		case <-ctx.Done():
			return placedOrder{}, errors.Join(ctx.Err(), lastErr)
		case <-time.After(50 * time.Millisecond): // retry pacing
		}
	}
	return placedOrder{}, fmt.Errorf("no answer before the deadline: %w", lastErr)
}

// cancelOrder POSTs /orders/{id}/cancel, retrying through api restarts and
// cut connections until it gets an answer or the deadline passes. Cancel is
// idempotent (cancelling a cancelled order answers 200 and emits nothing),
// so a retry after an api killed mid-request is safe whether or not the
// first attempt committed. A 200 is the acknowledgement.
func cancelOrder(ctx context.Context, apiURL, id string, deadline time.Time) error {
	var lastErr error
	for time.Now().Before(deadline) {
		var o struct {
			Status string `json:"status"`
		}
		code, b, err := request(http.MethodPost, apiURL+"/orders/"+id+"/cancel", "", nil, &o)
		switch {
		case err == nil && code == http.StatusOK && o.Status == "cancelled":
			return nil
		case err == nil && code == http.StatusOK:
			return fmt.Errorf("POST /orders/%s/cancel: 200 with status %q", id, o.Status)
		case err == nil && code < 500:
			return fmt.Errorf("POST /orders/%s/cancel: %d %s", id, code, b)
		case err != nil:
			lastErr = err
		default:
			lastErr = fmt.Errorf("POST /orders/%s/cancel: %d %s", id, code, b)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), lastErr)
		case <-time.After(50 * time.Millisecond): // retry pacing
		}
	}
	return fmt.Errorf("no answer before the deadline: %w", lastErr)
}

// percentile returns the q-quantile of sorted durations.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1)+0.5)]
}

// jetStream is a stream of the test's own on the NATS server the project's
// machines run (brokertest), deleted after.
type jetStream struct {
	url, name, subject string
	js                 jetstream.JetStream
}

func newJetStream(t *testing.T) jetStream {
	t.Helper()
	_, js := brokertest.JetStream(t)
	st, subject := brokertest.Stream(t, js, "crashtest", 0)
	return jetStream{url: brokertest.NATSURL(), name: st.CachedInfo().Config.Name, subject: subject, js: js}
}

// consumerInfo is the stream's consumer "ledger", if it exists yet.
func (s jetStream) consumerInfo() *jetstream.ConsumerInfo {
	if s.js == nil {
		return nil
	}
	c, err := s.js.Consumer(context.Background(), s.name, "ledger")
	if err != nil {
		return nil
	}
	info, err := c.Info(context.Background())
	if err != nil {
		return nil
	}
	return info
}

// pending is how many messages the consumer has not acked yet: deliveries
// in flight, as far as the receiving side goes.
func (s jetStream) pending() int {
	if info := s.consumerInfo(); info != nil {
		return int(info.NumPending) + info.NumAckPending
	}
	return 0
}

// stored is how many messages the stream holds.
func (s jetStream) stored() uint64 {
	if s.js == nil {
		return 0
	}
	st, err := s.js.Stream(context.Background(), s.name)
	if err != nil {
		return 0
	}
	info, err := st.Info(context.Background())
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// withApplicationName returns dbURL with the application_name its sessions
// carry: how a test finds a process's sessions in pg_stat_activity.
func withApplicationName(t *testing.T, dbURL, name string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// tail is the end of a process's log, for a failure message.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
