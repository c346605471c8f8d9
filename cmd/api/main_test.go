package main

import (
	"testing"
	"time"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/proctest"
)

// The binary as deployed: it serves until SIGTERM, then drains and exits 0,
// saying so last. Everything else about the api is tested in-process, in
// internal/apiserver.
func TestStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	bin := proctest.Build(t, "github.com/outboxkit/orders/cmd/api")
	addr := proctest.FreeAddr(t)
	proctest.RequireStopsOnSIGTERM(t, bin, map[string]string{"DATABASE_URL": dbtest.URL(t), "API_ADDR": addr, "LOG_FORMAT": "json"},
		func() bool { return proctest.Ready(addr) }, 15*time.Second, `"msg":"api stopped"`)
}
