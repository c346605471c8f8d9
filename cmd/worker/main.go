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
	// The first signal starts a graceful stop, once Go's default handling
	// is back, so that a second one ends the process at once.
	signals, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-signals.Done()
		stop()
		cancel()
	}()
	if err := relayworker.Run(ctx, os.Args[1:], os.Environ(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
