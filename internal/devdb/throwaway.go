package devdb

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// defaultDirName is the throwaway cluster's directory, named after the
// service's database (LocalDatabase) so that two services made from this
// template, run on one machine, keep their clusters apart.
const defaultDirName = LocalDatabase + "-pg"

// cluster is where a throwaway cluster lives and who runs it.
type cluster struct {
	dir     string   // Options.Dir or its default, or a unique fallback
	data    string   // dir/data
	port    uint32   //
	lock    *os.File // held while the cluster is ours; nil where unsupported
	private bool     // dir was made just for this cluster: remove it all on Close
	runAs   *runAs   // OS user to run PostgreSQL as (when we are root), or nil
}

// startThrowaway starts a throwaway cluster, from installed binaries when
// there are some, else through embedded-postgres, and says so in one line
// at level, with why (the local server's probe) attached: the one line a
// person reads about which database the process uses.
func startThrowaway(ctx context.Context, opts Options, logger *slog.Logger, level slog.Level, why ...slog.Attr) (*Server, error) {
	binDir := findInstalled()

	var (
		ra  *runAs
		err error
	)
	if binDir != "" {
		if ra, err = lookupRunAs(); err != nil {
			return nil, err
		}
	} else if isRoot() {
		return nil, errors.New("devdb: no PostgreSQL binaries found, and embedded-postgres cannot run as root; " +
			"install PostgreSQL (e.g. apt-get install postgresql) or set DATABASE_URL")
	}

	c, err := claim(opts, ra)
	if err != nil {
		return nil, err
	}

	// A previous run that died without Close may have left a cluster running
	// (pg_ctl daemonizes it) and its files behind: stop it, wipe it.
	pgCtl := ""
	if binDir != "" {
		pgCtl = filepath.Join(binDir, "pg_ctl")
	} else if p := filepath.Join(c.dir, "runtime", "bin", "pg_ctl"); fileExists(p) {
		pgCtl = p
	}
	if fileExists(filepath.Join(c.data, "postmaster.pid")) && pgCtl != "" {
		logger.InfoContext(ctx, "stopping stale throwaway PostgreSQL", "data_dir", c.data)
		_ = c.run(context.WithoutCancel(ctx), pgCtl, "stop", "-D", c.data, "-m", "immediate", "-w", "-t", "10")
	}
	if err := os.RemoveAll(c.data); err != nil {
		c.release()
		return nil, fmt.Errorf("devdb: wipe stale data dir: %w", err)
	}

	if err := c.pickPort(opts.Port == 0); err != nil {
		c.release()
		return nil, err
	}

	var srv *Server
	if binDir != "" {
		srv, err = c.startInstalled(ctx, binDir)
	} else {
		srv, err = c.startEmbedded(ctx)
	}
	if err != nil {
		c.release()
		return nil, err
	}
	// The log redacts the password; the whole URL is in a file only the
	// developer reads (psql "$(cat <url_file>)"), gone with the cluster.
	urlFile := filepath.Join(c.data, "url")
	if err := os.WriteFile(urlFile, []byte(srv.URL+"\n"), 0o600); err != nil {
		_ = srv.Close()
		c.release()
		return nil, fmt.Errorf("devdb: %w", err)
	}
	logger.LogAttrs(ctx, level, "started throwaway PostgreSQL", append([]slog.Attr{slog.String("data_dir", c.data),
		slog.String("url", redact(srv.URL)), slog.String("url_file", urlFile), slog.Any("port", c.port),
		slog.String("bin_dir", binDir)}, why...)...)

	stop := srv.stop
	srv.stop = func() error {
		err := stop()
		if c.private {
			err = errors.Join(err, os.RemoveAll(c.dir))
		}
		c.release()
		if err != nil {
			logger.WarnContext(context.Background(), "stopping throwaway PostgreSQL failed", "data_dir", c.data, "error", err)
			return err
		}
		logger.InfoContext(context.Background(), "stopped throwaway PostgreSQL", "data_dir", c.data)
		return nil
	}
	return srv, nil
}

// claim takes Options.Dir (default os.TempDir()/<LocalDatabase>-pg) for a new
// cluster. If another live process holds the default directory, it uses a
// fresh unique one (and a free port) instead, so that concurrent `go test`
// processes don't fight; an explicit Dir that is in use is an error.
func claim(opts Options, ra *runAs) (*cluster, error) {
	c := &cluster{dir: opts.Dir, port: opts.Port, runAs: ra}
	if c.port == 0 {
		c.port = DefaultPort
	}
	if c.dir == "" {
		c.dir = filepath.Join(os.TempDir(), defaultDirName)
	}
	dir, err := filepath.Abs(c.dir)
	if err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	c.dir = dir

	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("devdb: create %s: %w", c.dir, err)
	}
	c.lock, err = lockFile(filepath.Join(c.dir, "lock"))
	if errors.Is(err, errLocked) && opts.Dir == "" {
		c.dir, err = os.MkdirTemp(os.TempDir(), defaultDirName+"-*")
		if err != nil {
			return nil, fmt.Errorf("devdb: %w", err)
		}
		c.private = true
		if opts.Port == 0 {
			c.port = 0 // DefaultPort is surely taken by the other cluster
		}
		c.lock, err = lockFile(filepath.Join(c.dir, "lock"))
	}
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("devdb: throwaway cluster directory %s is in use by another process; pass another Dir or set DATABASE_URL", c.dir)
	}
	if err != nil {
		return nil, fmt.Errorf("devdb: lock %s: %w", c.dir, err)
	}

	if ra != nil {
		// PostgreSQL runs as ra: it must be able to reach its data dir.
		if err := os.Chmod(c.dir, 0o755); err != nil {
			c.release()
			return nil, fmt.Errorf("devdb: %w", err)
		}
	}
	c.data = filepath.Join(c.dir, "data")
	return c, nil
}

// pickPort checks that c.port is free; if it is zero, or taken and
// mayChange, it picks a free port.
func (c *cluster) pickPort(mayChange bool) error {
	if c.port != 0 && portFree(c.port) {
		return nil
	}
	if c.port != 0 && !mayChange {
		return fmt.Errorf("devdb: port %d on 127.0.0.1 is already in use; pick another Port or set DATABASE_URL", c.port)
	}
	p, err := freePort()
	if err != nil {
		return fmt.Errorf("devdb: find a free port: %w", err)
	}
	c.port = p
	return nil
}

func (c *cluster) release() {
	if c.lock != nil {
		_ = c.lock.Close() // closing the file drops the flock
		c.lock = nil
	}
}

// startInstalled runs initdb and pg_ctl from binDir.
func (c *cluster) startInstalled(ctx context.Context, binDir string) (*Server, error) {
	if err := os.Mkdir(c.data, 0o700); err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	if err := c.runAs.chown(c.data); err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}

	// A password, not trust: the cluster listens on 127.0.0.1, where any
	// local user could otherwise connect as its superuser (and run programs
	// as the developer with COPY ... TO PROGRAM).
	password := newPassword()
	pwfile := filepath.Join(c.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		_ = os.RemoveAll(c.data)
		return nil, fmt.Errorf("devdb: %w", err)
	}
	defer os.Remove(pwfile)
	if err := c.runAs.chown(pwfile); err != nil {
		_ = os.RemoveAll(c.data)
		return nil, fmt.Errorf("devdb: %w", err)
	}
	err := c.run(ctx, filepath.Join(binDir, "initdb"),
		"-D", c.data, "-U", "postgres", "-A", "scram-sha-256", "--pwfile", pwfile,
		"--encoding=UTF8", "--locale=C", "--no-sync")
	if err != nil {
		_ = os.RemoveAll(c.data)
		if c.runAs != nil {
			err = fmt.Errorf("%w\n(initdb runs as OS user %q, which must be able to reach %s)", err, c.runAs.name, c.data)
		}
		return nil, fmt.Errorf("devdb: initdb: %w", err)
	}

	conf := fmt.Sprintf(`
# Throwaway cluster started by github.com/outboxkit/orders/internal/devdb.
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
`, c.port, strings.ReplaceAll(c.data, "'", "''"))
	if err := appendFile(filepath.Join(c.data, "postgresql.conf"), conf); err != nil {
		_ = os.RemoveAll(c.data)
		return nil, fmt.Errorf("devdb: %w", err)
	}

	pgCtl := filepath.Join(binDir, "pg_ctl")
	logFile := filepath.Join(c.data, "postgres.log")
	stop := func(mode string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := c.run(ctx, pgCtl, "stop", "-D", c.data, "-m", mode, "-w", "-t", "20")
		if err != nil && !fileExists(filepath.Join(c.data, "postmaster.pid")) {
			return nil // already stopped, e.g. by a signal to its process group
		}
		return err
	}

	if err := c.run(ctx, pgCtl, "start", "-D", c.data, "-l", logFile, "-w", "-t", "30"); err != nil {
		log, _ := os.ReadFile(logFile)
		_ = stop("immediate")
		_ = os.RemoveAll(c.data)
		return nil, fmt.Errorf("devdb: pg_ctl start: %w\nserver log:\n%s", err, tail(log, 2000))
	}

	return &Server{
		URL:     fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", password, c.port),
		Started: true,
		DataDir: c.data,
		stop: func() error {
			err := stop("fast")
			if err != nil {
				err = errors.Join(err, stop("immediate"))
			}
			return errors.Join(err, os.RemoveAll(c.data))
		},
	}, nil
}

// run runs a PostgreSQL program as c.runAs (if set), in its own session so a
// Ctrl-C meant for the caller doesn't reach the server, and returns its
// output in the error if it fails.
func (c *cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl start leaves the server running; should it ever hold on to our
	// output pipe, don't wait for it forever.
	cmd.WaitDelay = 5 * time.Second
	c.runAs.apply(cmd)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s", cmd, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// installedDirs lists directories that may hold PostgreSQL binaries, most
// preferred first.
func installedDirs() []string {
	var dirs []string
	dirs = append(dirs, newestFirst(glob("/usr/lib/postgresql/*/bin"))...)
	dirs = append(dirs, "/usr/local/pgsql/bin")
	dirs = append(dirs, newestFirst(glob("/opt/homebrew/opt/postgresql*/bin"))...)
	dirs = append(dirs, newestFirst(glob("/usr/local/opt/postgresql*/bin"))...)
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	return dirs
}

// findInstalled returns the first directory holding pg_ctl, initdb and
// postgres, or "".
func findInstalled() string {
	for _, dir := range installedDirs() {
		ok := true
		for _, name := range []string{"pg_ctl", "initdb", "postgres"} {
			if _, err := exec.LookPath(filepath.Join(dir, name)); err != nil {
				ok = false
				break
			}
		}
		if ok {
			return dir
		}
	}
	return ""
}

func glob(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	return m
}

var versionRE = regexp.MustCompile(`\d+(\.\d+)?`)

// newestFirst sorts bin directories by the version in their parent's name
// (".../15/bin", ".../postgresql@16/bin"), highest first; unversioned last.
func newestFirst(dirs []string) []string {
	version := func(dir string) float64 {
		v, err := strconv.ParseFloat(versionRE.FindString(filepath.Base(filepath.Dir(dir))), 64)
		if err != nil {
			return -1
		}
		return v
	}
	dirs = slices.Clone(dirs)
	slices.SortStableFunc(dirs, func(a, b string) int {
		va, vb := version(a), version(b)
		switch {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	return dirs
}

func portFree(port uint32) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func freePort() (uint32, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return uint32(l.Addr().(*net.TCPAddr).Port), nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// newPassword returns a random password for a throwaway cluster's
// superuser: 32 hex digits, safe in a URL.
func newPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
