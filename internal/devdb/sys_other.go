//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package devdb

import (
	"errors"
	"os"
	"os/exec"
)

// runAs is unsupported here: PostgreSQL runs as the current user.
type runAs struct{ name string }

func isRoot() bool { return false }

func lookupRunAs() (*runAs, error) { return nil, nil }

func (r *runAs) apply(*exec.Cmd) {}

func (r *runAs) chown(string) error { return nil }

var errLocked = errors.New("locked by another process")

// lockFile does not lock on this platform; it only creates path.
func lockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}
