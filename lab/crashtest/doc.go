// Package crashtest proves the outbox under fire, with the real built
// binaries (api, worker, consumer) as separate processes against a real
// PostgreSQL: its tests SIGKILL and restart them, cut their database
// connections, make the receiver fail, and then count what was lost,
// invented, applied twice or applied out of order (orders are placed and a
// third of them cancelled at once, so an order.cancelled is often written
// while its order.placed is still on its way). They also measure head-of-line isolation and
// recovery from a killed worker, at the default settings.
//
// The package has no code of its own beyond this comment; everything is in
// its tests:
//
//	go test -run TestCrash -v ./lab/crashtest                       # CI size
//	CRASH_ORDERS=5000 CRASH_SECONDS=120 go test -run TestCrash -v ./lab/crashtest
//	go test -run 'TestHeadOfLine|TestRecoveryAfterSIGKILL' -v ./lab/crashtest
//
// All are skipped under -short.
package crashtest
