package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// A refusal says why twice: Reason for the person who sent the input (the
// admin API's problem detail), Error for a log, with the chain that
// wrapped it. Vetting a change needs no database.
func ExampleReason() {
	svc := admin.New(nil, netguard.Guard{}, slog.New(slog.DiscardHandler))
	bad := "ftp://1.1.1.1/hooks"
	err := svc.CheckEndpointChange(context.Background(), admin.EndpointChange{URL: &bad})
	fmt.Println(errors.Is(err, admin.ErrInvalidEndpoint), errors.Is(err, netguard.ErrInvalidURL))
	fmt.Println(admin.Reason(err))
	fmt.Println(err)
	// Output:
	// true true
	// url: scheme "ftp" is not http or https
	// outbox: invalid webhook endpoint: checking webhook url: netguard: invalid webhook url: scheme "ftp" is not http or https
}
