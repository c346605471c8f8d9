// Package db owns the database schema: the goose migrations of every module
// and River's tables, embedded in the binary so `api migrate` needs no files
// on disk. Each module's SQL queries live beside them in queries/, and sqlc
// generates them into that module's internal package.
package db

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:generate go run ./internal/genriver

//go:embed migrations/*.sql
var embedded embed.FS

// Migrations is the schema's whole history, for tools that want to read it.
var Migrations, _ = fs.Sub(embedded, "migrations")

// Migrate applies every pending migration. It is safe to run concurrently from
// several processes (a Postgres advisory lock serialises them) and running it
// again when nothing is pending changes nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()

	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("creating migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, Migrations,
		goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("creating migration provider: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return fmt.Errorf("applying migrations: %w", err)
	}
	// One line for a person (a new database applies dozens), each file
	// below it for whoever debugs a migration.
	var took time.Duration
	for _, r := range results {
		took += r.Duration
		logger.DebugContext(ctx, "applied migration",
			slog.Int64("version", r.Source.Version),
			slog.String("file", r.Source.Path),
			slog.Duration("duration", r.Duration))
	}
	if len(results) > 0 {
		logger.InfoContext(ctx, "applied migrations", slog.Int("count", len(results)),
			slog.Int64("from_version", results[0].Source.Version),
			slog.Int64("to_version", results[len(results)-1].Source.Version),
			slog.Duration("duration", took))
	}
	return nil
}
