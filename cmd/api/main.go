// Command api serves the orders HTTP API and the outbox admin routes.
//
//	api           serve (applies pending migrations first)
//	api migrate   apply every migration (the app's and River's) and exit
//
// Configuration is read from the environment; see README.md.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxkit/orders/internal/apiserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return apiserver.Run(ctx, args, getenv, stdout)
}
