//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package devdb

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// runAs is the OS user PostgreSQL runs as when we are root (initdb and
// postgres refuse to run as root).
type runAs struct {
	name     string
	uid, gid uint32
}

func isRoot() bool { return os.Geteuid() == 0 }

// lookupRunAs returns the "postgres" OS user if we are root, else nil.
func lookupRunAs() (*runAs, error) {
	if !isRoot() {
		return nil, nil
	}
	const name = "postgres"
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("devdb: running as root, and PostgreSQL refuses to run as root; "+
			"it would run as OS user %q, but: %w (create that user, run as a normal user, or set DATABASE_URL)", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("devdb: uid of %q: %w", name, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("devdb: gid of %q: %w", name, err)
	}
	return &runAs{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
}

// apply makes cmd run in its own session, as r if r is not nil.
func (r *runAs) apply(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if r != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: r.uid, Gid: r.gid}
	}
}

// chown gives path to r; nothing if r is nil.
func (r *runAs) chown(path string) error {
	if r == nil {
		return nil
	}
	return os.Chown(path, int(r.uid), int(r.gid))
}

var errLocked = errors.New("locked by another process")

// lockFile takes an exclusive lock on path (creating it), held until the
// returned file is closed or the process exits. errLocked if another process
// holds it.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, err
	}
	return f, nil
}
