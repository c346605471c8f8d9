package outbox

import (
	"context"
	"testing"
)

// The write path with tracing off: no span in the context costs Enqueue one
// context lookup, and nothing is allocated or stored.
func TestTraceContextWithoutASpanIsFree(t *testing.T) {
	ctx := context.WithValue(context.Background(), struct{}{}, "request-scoped value")
	var got []byte
	allocs := testing.AllocsPerRun(1000, func() { got = traceContext(ctx) })
	if got != nil || allocs != 0 {
		t.Fatalf("traceContext without a span = %q with %v allocs, want nil with 0", got, allocs)
	}
}

func BenchmarkTraceContextWithoutASpan(b *testing.B) {
	ctx := context.WithValue(context.Background(), struct{}{}, "request-scoped value")
	b.ReportAllocs()
	for b.Loop() {
		if traceContext(ctx) != nil {
			b.Fatal("a trace context from no span")
		}
	}
}
