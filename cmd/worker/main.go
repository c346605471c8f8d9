// Command worker runs the outbox relay: River jobs that claim committed
// messages, deliver them as signed webhooks, and prune delivered history.
// Any number of workers may run against one database.
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

	"github.com/outboxkit/orders/internal/relayworker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return relayworker.Run(ctx, args, getenv, stdout)
}
