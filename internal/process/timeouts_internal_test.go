package process

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/httpjson"
)

// Serve's timeouts leave room for an answer: the body's deadline passes
// before the handler's, and the handler's before the write's.
func TestServerTimeoutsLeaveRoomForAnswers(t *testing.T) {
	t.Parallel()
	s := serverTimeouts
	require.Less(t, s.header, s.body)
	require.Less(t, s.body, s.handler)
	require.Less(t, s.handler, s.write)
}

// A body that stops arriving is answered 408, while the connection can
// still carry the answer: with the body's deadline at the write's, the
// handler's answer was written past the write deadline and the client got
// nothing. The server is Serve's, with its timeouts scaled down (the test
// is about them).
func TestBodyThatStopsArrivingIsAnswered408(t *testing.T) {
	t.Parallel()
	scaled := timeouts{header: 100 * time.Millisecond, body: 200 * time.Millisecond, handler: 400 * time.Millisecond, write: 600 * time.Millisecond}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v struct{}
		if err := httpjson.Decode(w, r, &v); err != nil {
			httpjson.WriteError(w, err)
		}
	})
	srv := newServer(h, NewLogger(io.Discard, "json"), scaled)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Close() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "an answer, not a closed connection")
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, "%s", body)
	require.True(t, strings.Contains(string(body), "not received in time"), "%s", body)
}
