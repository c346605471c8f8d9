// Package proctest holds what tests need to run this service's programs for
// real, in-process or as binaries: a place for their output, free loopback
// ports, an environment from a map, and checks on their logs.
package proctest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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

// Environ turns a map into the environment the programs' Run takes, a
// list of name=value as os.Environ returns it.
func Environ(env map[string]string) []string {
	environ := make([]string, 0, len(env))
	for name, value := range env {
		environ = append(environ, name+"="+value)
	}
	return environ
}

// FreeAddr returns a loopback address whose port was free a moment ago,
// and never one it returned before in this process. The port lies below
// Linux's ephemeral range (32768 and up): a port the kernel hands out for
// port 0 is free only until the next test, in this package or another, listens
// on port 0 or dials out, and the program under test binds it a while later.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 1000 {
		addr := fmt.Sprintf("127.0.0.1:%d", 26000+rand.IntN(6000))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		require.NoError(t, ln.Close())
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
	t.Fatal("no free port in 26000-31999")
	return ""
}

// handedOut holds the addresses FreeAddr returned.
var handedOut sync.Map

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

// Build compiles the main package pkg (an import path) with go build, as a
// deployment would, into a directory removed when t ends, and returns the
// binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), path.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	require.NoError(t, err, "go build %s:\n%s", pkg, out)
	return bin
}

// Process is a program a test started (Start).
type Process struct {
	Cmd *exec.Cmd
	// Out is what it wrote, stdout and stderr together.
	Out *Output
	// Exited receives its exit (cmd.Wait's error) once.
	Exited chan error
}

// Start runs the program bin with env and nothing else of the test's
// environment but PATH, HOME and TMPDIR; it is killed when t ends.
func Start(t testing.TB, bin string, env map[string]string) *Process {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &Process{Cmd: cmd, Out: &Output{}, Exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	require.NoError(t, cmd.Start())
	go func() { p.Exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

// Ready reports whether GET http://addr/readyz answers 200.
func Ready(addr string) bool {
	res, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// RequireStopsOnSIGTERM runs the program bin with env, waits until ready
// reports true, sends it SIGTERM and requires it to exit 0 within grace,
// with lastLine (a log message) in its last line. It returns the
// program's output.
func RequireStopsOnSIGTERM(t testing.TB, bin string, env map[string]string, ready func() bool, grace time.Duration, lastLine string) string {
	t.Helper()
	p := Start(t, bin, env)
	cmd, out, exited := p.Cmd, p.Out, p.Exited
	require.Eventually(t, func() bool {
		select {
		case err := <-exited:
			exited <- err
			return true
		default:
			return ready()
		}
	}, 60*time.Second, 20*time.Millisecond, "never became ready")
	select {
	case err := <-exited:
		t.Fatalf("exited before SIGTERM: %v\n%s", err, out.String())
	default:
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status after SIGTERM; output:\n%s", out.String())
	case <-time.After(grace):
		t.Fatalf("still running %s after SIGTERM; output:\n%s", grace, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Contains(t, lines[len(lines)-1], lastLine, "the last line says it stopped; output:\n%s", out.String())
	return out.String()
}

// RequireMisspelt asserts that a program's output warns of misspelt
// variables with exactly the warnings want (Env.Misspelt's), and no other.
func RequireMisspelt(t testing.TB, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		require.Contains(t, out, w)
	}
	require.Equal(t, len(want), strings.Count(out, "nothing reads it"), "only the misspellings: %s", out)
}

// VariablesRead returns, sorted and once each, the names parse reads
// through the getenv it is given (every one unset): what a program's
// documentation must list.
func VariablesRead(parse func(getenv func(string) string)) []string {
	var read []string
	parse(func(name string) string {
		read = append(read, name)
		return ""
	})
	slices.Sort(read)
	return slices.Compact(read)
}
