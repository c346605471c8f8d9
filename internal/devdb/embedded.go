package devdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
)

// startEmbedded starts PostgreSQL from binaries that embedded-postgres
// downloads (and caches under ~/.embedded-postgres-go). It needs internet the
// first time, and cannot run as root.
func (c *cluster) startEmbedded(ctx context.Context) (*Server, error) {
	password := newPassword()
	runtime := filepath.Join(c.dir, "runtime")
	cfg := embeddedpostgres.DefaultConfig().
		Port(c.port).
		Username("postgres").
		Password(password).
		Database("postgres").
		RuntimePath(runtime).
		DataPath(c.data).
		Logger(io.Discard).
		StartTimeout(60 * time.Second).
		StartParameters(map[string]string{
			"listen_addresses":   "127.0.0.1",
			"max_connections":    "200",
			"fsync":              "off",
			"synchronous_commit": "off",
			"full_page_writes":   "off",
		})
	db := embeddedpostgres.NewDatabase(cfg)

	// Start knows no context, and its download has no timeout: don't let it
	// hold the caller past ctx.
	done := make(chan error, 1)
	go func() { done <- db.Start() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		go func() {
			if <-done == nil {
				_ = db.Stop()
			}
		}()
		err = ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("devdb: no PostgreSQL binaries are installed, and starting one with embedded-postgres "+
			"(which downloads them) failed: %w\n"+
			"Install PostgreSQL (e.g. apt-get install postgresql, brew install postgresql@17) or set DATABASE_URL", err)
	}

	return &Server{
		URL:     fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", password, c.port),
		Started: true,
		DataDir: c.data,
		stop: func() error {
			return errors.Join(db.Stop(), os.RemoveAll(c.data), os.RemoveAll(runtime))
		},
	}, nil
}
