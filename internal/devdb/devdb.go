// Package devdb gives cmd/dev (which runs the api and the worker locally) and
// the test helpers a PostgreSQL database without the user setting anything up.
//
// Ensure picks, in order of preference:
//
//  1. the URL the caller passes in Options.URL (typically DATABASE_URL);
//  2. a PostgreSQL server answering on 127.0.0.1:5432 as role postgres, in
//     which it creates (if needed) and returns the database LocalDatabase
//     (named after the service);
//  3. a throwaway cluster it starts itself, from the PostgreSQL binaries
//     installed on the machine or, if there are none, from binaries downloaded
//     by github.com/fergusstrange/embedded-postgres.
//
// The package reads no environment variables: everything comes in through
// Options.
package devdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// DefaultPort is the port a throwaway cluster listens on when
	// Options.Port is zero.
	DefaultPort uint32 = 54329

	// LocalDatabase is the database Ensure uses (and creates if missing) on a
	// PostgreSQL server found at 127.0.0.1:5432.
	LocalDatabase = "orders"

	// localAdminURL is how Ensure probes for a server on the standard port.
	localAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	probeTimeout  = 2 * time.Second
)

// Options for Ensure.
type Options struct {
	// URL is DATABASE_URL if the user set one; it is used as is when non-empty.
	URL string
	// Logger says which database was chosen, and if a throwaway one was
	// started. Nil discards.
	Logger *slog.Logger
	// Dir is where a throwaway cluster lives (its data in Dir/data). Default
	// os.TempDir()/<LocalDatabase>-pg, named after the service; if another
	// process's cluster holds that, a fresh os.TempDir()/<LocalDatabase>-pg-*
	// is used instead. Data is not kept between runs: a cluster left behind
	// by a run that died is stopped and wiped.
	Dir string
	// Port is the port of a throwaway cluster, on 127.0.0.1. Default
	// DefaultPort (54329), or a free port if that one is taken.
	Port uint32
}

// Server is a running database the caller may use; Close stops it if Ensure
// started it.
type Server struct {
	// URL is a connection string for the database.
	URL string
	// Started reports whether Ensure started a throwaway cluster for it.
	Started bool
	// DataDir is the throwaway cluster's data directory ("" unless Started).
	DataDir string

	stop      func() error
	closeOnce sync.Once
	closeErr  error
}

// Close stops the throwaway cluster and removes its data directory if Ensure
// started one; otherwise it does nothing. It is safe to call more than once.
func (s *Server) Close() error {
	if s == nil || s.stop == nil {
		return nil
	}
	s.closeOnce.Do(func() { s.closeErr = s.stop() })
	return s.closeErr
}

// Ensure returns, in order of preference: opts.URL; else the database
// LocalDatabase on the PostgreSQL at 127.0.0.1:5432 if one answers there (creating
// the database if needed); else a throwaway PostgreSQL it starts. The caller
// must Close the returned Server.
//
// If a server answers on 127.0.0.1:5432 but refuses the connection as role
// postgres (no such role, password required, ...), Ensure logs a warning and
// starts a throwaway cluster instead.
func Ensure(ctx context.Context, opts Options) (*Server, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}

	if opts.URL != "" {
		logger.InfoContext(ctx, "using configured database", "url", redact(opts.URL))
		return &Server{URL: opts.URL}, nil
	}

	dbURL, err := useLocal(ctx, localAdminURL)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		logger.InfoContext(ctx, "using local PostgreSQL", "url", dbURL)
		return &Server{URL: dbURL}, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, errRefused) && errors.As(err, &pgErr):
		// A server that is there but will not let us in is worth a warning.
		return startThrowaway(ctx, opts, logger, slog.LevelWarn,
			slog.String("why", "PostgreSQL on 127.0.0.1:5432 refused the connection"), slog.Any("error", err))
	case errors.Is(err, errRefused):
		return startThrowaway(ctx, opts, logger, slog.LevelInfo,
			slog.String("why", "no PostgreSQL on 127.0.0.1:5432"), slog.Any("probe_error", err))
	default:
		return nil, err
	}
}

// errRefused marks a failed probe: nothing answered, or the server would not
// let us in. Either way Ensure falls back to a throwaway cluster.
var errRefused = errors.New("no usable PostgreSQL")

// useLocal connects to adminURL and makes sure database LocalDatabase exists
// on that server, returning its URL.
func useLocal(ctx context.Context, adminURL string) (string, error) {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return "", fmt.Errorf("devdb: parse %q: %w", adminURL, err)
	}
	cfg.ConnectTimeout = probeTimeout

	probeCtx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(probeCtx, cfg)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errRefused, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if err := createDatabase(ctx, conn, LocalDatabase); err != nil {
		return "", fmt.Errorf("devdb: database %q on 127.0.0.1:5432: %w", LocalDatabase, err)
	}

	u, err := url.Parse(adminURL)
	if err != nil {
		return "", fmt.Errorf("devdb: parse %q: %w", adminURL, err)
	}
	u.Path = "/" + LocalDatabase
	return u.String(), nil
}

// createDatabase creates database name unless it exists. Several test
// processes may race to create it; losing the race is fine.
func createDatabase(ctx context.Context, conn *pgx.Conn, name string) error {
	var exists bool
	err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		return fmt.Errorf("look up: %w", err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		// duplicate_database, or unique_violation on pg_database when two
		// CREATE DATABASE run at the same time.
		return nil
	}
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	return nil
}

// redact hides a password in a URL for logging. Key/value connection strings
// are not logged at all, as they cannot be redacted reliably.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(connection string not shown)"
	}
	return u.Redacted()
}
