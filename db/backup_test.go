package db_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/webhook"
)

// receiver is a real webhook receiver: it verifies each signature and counts
// the deliveries of every webhook-id, so duplicates are seen, not assumed.
type receiver struct {
	srv       *httptest.Server
	mu        sync.Mutex
	verifier  *webhook.Verifier
	received  map[string]int
	badSigned int
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{received: map[string]int{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.verifier == nil || rc.verifier.Verify(r.Header, body) != nil {
			rc.badSigned++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rc.received[r.Header.Get(webhook.HeaderID)]++
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) count(id string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.received[id]
}

// deliveries is the number of accepted requests, duplicates included.
func (rc *receiver) deliveries() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, c := range rc.received {
		n += c
	}
	return n
}

// script runs one of the scripts the db:backup and db:restore tasks run,
// against databaseURL.
func script(t *testing.T, databaseURL, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join("..", "scripts", name)}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s: %s", name, stderr.String())
	t.Logf("%s: %s", name, strings.TrimSpace(stderr.String()))
	return strings.TrimSpace(string(out))
}

// startRelay runs a real relay (River client) on pool; stop stops it gracefully.
func startRelay(t *testing.T, pool *pgxpool.Pool) (stop func()) {
	t.Helper()
	cfg := relay.Config{PollInterval: 50 * time.Millisecond, BackoffBase: 20 * time.Millisecond,
		BackoffMax: 100 * time.Millisecond, DeliveryTimeout: 2 * time.Second}
	relay, err := relay.New(pool, cfg, &relay.HTTPTransport{Client: netguard.Guard{AllowPrivate: true}.Client()},
		slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	require.NoError(t, relay.Start(context.Background()))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, relay.Stop(ctx))
		})
	}
	t.Cleanup(stop)
	return stop
}

// messageIDs returns the event ids (the webhook-id) of the given orders'
// outbox messages, in order: with one endpoint, one message per event.
func messageIDs(t *testing.T, pool *pgxpool.Pool, placed []orders.Order) []string {
	t.Helper()
	ids := make([]string, len(placed))
	for i, o := range placed {
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT m.event_id::text FROM outbox_messages m JOIN outbox_events e ON e.id = m.event_id WHERE e.payload->>'id' = $1`, o.ID.String()).Scan(&ids[i]))
	}
	return ids
}

func statusCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status, count(*)::int FROM outbox_messages GROUP BY status`)
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		got[s] = n
	}
	require.NoError(t, rows.Err())
	return got
}

// TestBackupAndRestoreRedeliverWhatWasPending proves the outbox is in a
// backup like any table, and what a restore means for delivery: a backup is
// taken (with the script `task db:backup` runs) while some messages are
// delivered and some pending; everything is then delivered; the backup is
// restored (with `task db:restore`'s script) into a fresh database and a
// relay started on it. The messages pending at backup time come back and are
// delivered again: each reaches the receiver twice with the same webhook-id,
// the duplicates a consumer deduplicates. Messages delivered before the
// backup are not sent again; an order placed after the backup is not in the
// restored database at all. Restoring again over the populated database
// returns it to the backup's state.
func TestBackupAndRestoreRedeliverWhatWasPending(t *testing.T) {
	for _, bin := range []string{"bash", "pg_dump", "pg_restore"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed: %v", bin, err)
		}
	}
	t.Parallel()
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)

	srcURL := dbtest.URL(t)
	src, err := pgxpool.New(ctx, srcURL)
	require.NoError(t, err)
	t.Cleanup(src.Close)
	rc := newReceiver(t)
	ep, err := admin.New(src, netguard.Guard{AllowPrivate: true}, logger).
		CreateEndpoint(ctx, rc.srv.URL+"/hook", []string{orders.EventPlaced})
	require.NoError(t, err)
	rc.verifier, err = webhook.NewVerifier(ep.Secret)
	require.NoError(t, err)
	svc := orders.NewService(src, logger)
	place := func(n int) []orders.Order {
		var out []orders.Order
		for i := range n {
			o, _, err := svc.Place(ctx, orders.PlaceRequest{CustomerID: "c-" + uuid.NewString()[:8],
				Lines: []orders.Line{{SKU: "A-1", Quantity: int64(i + 1), UnitPriceCents: 500}}})
			require.NoError(t, err)
			out = append(out, o)
		}
		return out
	}

	// Two orders announced before the backup.
	early := place(2)
	stop := startRelay(t, src)
	require.Eventually(t, func() bool { return statusCounts(t, src)[outbox.StatusDelivered] == 2 },
		15*time.Second, 20*time.Millisecond)
	stop()

	// Three orders whose messages are pending when the backup is taken.
	pending := place(3)
	pendingIDs := messageIDs(t, src, pending)
	require.Equal(t, map[string]int{"delivered": 2, "pending": 3}, statusCounts(t, src))
	file := script(t, srcURL, "db-backup", filepath.Join(t.TempDir(), "backups", "orders.dump"))
	require.FileExists(t, file)
	list, err := exec.Command("pg_restore", "--list", file).Output()
	require.NoError(t, err)
	for _, table := range []string{"outbox_messages", "outbox_events", "webhook_endpoints", "orders", "order_lines", "goose_db_version"} {
		// The outbox tables' rows are in their partitions (outbox_messages_p...).
		require.Regexp(t, `TABLE DATA public `+table+`(_legacy|_p\d{8}t\d{4})? `, string(list), "the backup holds %s", table)
	}

	// After the backup: one more order, and the relay delivers everything.
	late := place(1)
	all := append(append(append([]orders.Order{}, early...), pending...), late...)
	allIDs := messageIDs(t, src, all)
	startRelay(t, src)
	require.Eventually(t, func() bool { return statusCounts(t, src)[outbox.StatusDelivered] == 6 },
		15*time.Second, 20*time.Millisecond)
	for _, id := range allIDs {
		require.Equal(t, 1, rc.count(id), "delivered once before the restore: %s", id)
	}

	// Restore into a fresh database: the outbox is as it was at backup time.
	dstURL := dbtest.EmptyURL(t)
	script(t, dstURL, "db-restore", file)
	dst, err := pgxpool.New(ctx, dstURL)
	require.NoError(t, err)
	t.Cleanup(dst.Close)
	require.Equal(t, map[string]int{"delivered": 2, "pending": 3}, statusCounts(t, dst))
	require.Equal(t, pendingIDs, messageIDs(t, dst, pending), "the same messages, with the same ids")
	var lateOrders int
	require.NoError(t, dst.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, late[0].ID).Scan(&lateOrders))
	require.Zero(t, lateOrders, "an order placed after the backup is not in it")

	// A relay on the restored database delivers the pending messages again.
	before := rc.deliveries()
	stopDst := startRelay(t, dst)
	require.Eventually(t, func() bool { return statusCounts(t, dst)[outbox.StatusDelivered] == 5 },
		15*time.Second, 20*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // a few more polls: nothing else may arrive
	duplicates := 0
	for _, id := range pendingIDs {
		require.Equal(t, 2, rc.count(id), "pending at backup time: delivered before the restore and again after: %s", id)
		duplicates++
	}
	for _, id := range messageIDs(t, src, append(early, late...)) {
		require.Equal(t, 1, rc.count(id), "delivered before the backup, or placed after it: sent once: %s", id)
	}
	require.Equal(t, before+duplicates, rc.deliveries())
	require.Zero(t, rc.badSigned, "the restored endpoint secret still signs")

	// Restoring over a database that has the schema and rows replaces
	// them: back to the backup's state.
	stopDst()
	script(t, dstURL, "db-restore", file)
	require.Equal(t, map[string]int{"delivered": 2, "pending": 3}, statusCounts(t, dst))
	t.Logf("backup with 2 delivered + 3 pending; 6 messages delivered before the restore; "+
		"after the restore %d redelivered with the same webhook-id (the expected duplicates), 0 others", duplicates)
}
