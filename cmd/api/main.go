// Command api serves the orders HTTP API and the outbox admin routes.
//
//	api                     serve (applies pending migrations first)
//	api migrate             apply every migration (the app's and River's) and exit
//	api reencrypt-secrets   seal every endpoint's signing secrets under the
//	                        first key of OUTBOX_SECRET_KEYS and exit
//
// Configuration is read from the environment; see docs/reference.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxkit/orders/internal/apiserver"
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
	if err := apiserver.Run(ctx, os.Args[1:], os.Environ(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}
