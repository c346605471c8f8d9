// Command worker runs the outbox relay: River jobs that claim committed
// messages, deliver them as signed webhooks, and prune delivered history.
// Any number of workers may run against one database.
//
// Configuration is read from the environment; see docs/reference.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxkit/orders/internal/relayworker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts a graceful stop; a second one, with Go's
	// default handling restored, ends the process at once.
	context.AfterFunc(ctx, stop)
	if err := relayworker.Run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
