package relay

import (
	"context"
	"fmt"

	"github.com/outboxkit/orders/internal/outbox/destination"
)

// Target is where d goes: its Destination, or, when that was not set, its
// URL read.
func (d Delivery) Target() destination.Destination {
	if d.Destination.Kind != "" {
		return d.Destination
	}
	// Read, not checked: the relay checked it before sending.
	t, _ := destination.Parse(d.URL)
	return t
}

// Router is the relay's Transport when destinations are of several kinds:
// it sends each delivery with the transport of its destination's kind. A
// kind with no transport (no broker configured on this worker) fails the
// attempt with an error that says so, and the destination backs off alone.
type Router map[string]Transport

// Deliver implements Transport.
func (r Router) Deliver(ctx context.Context, d Delivery) Result {
	d.Destination = d.Target()
	t := r[d.Destination.Kind]
	if t == nil {
		return Result{Err: fmt.Errorf("no %s connection is configured on this worker", d.Destination.Kind)}
	}
	return t.Deliver(ctx, d)
}
