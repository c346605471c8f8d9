// Package proctest holds what tests need to run this service's programs for
// real, in-process or as binaries: a place for their output, free loopback
// ports, an environment from a map, and checks on their logs.
package proctest

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Output collects a program's output: the program writes from many
// goroutines while the test reads.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Tail returns the last n bytes written, for failure messages.
func (o *Output) Tail(n int) string {
	s := o.String()
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Getenv turns a map into the getenv function the programs' run takes.
func Getenv(env map[string]string) func(string) string {
	return func(name string) string { return env[name] }
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// RequireJSONLogs checks that every line a program logged is a JSON object.
func RequireJSONLogs(t testing.TB, logs string) {
	t.Helper()
	for line := range strings.Lines(logs) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		require.Truef(t, json.Valid([]byte(line)), "log line is not JSON: %s", line)
	}
}
