package relay

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A lease whose taking committed but whose answer was lost (the connection
// broke at that moment) is given back: the job saw an error, and a lease
// held by its own live relay kept every later job of the destination away
// for as long as the relay lived, its messages never sent. The first
// message, claimed with the lease, goes back too, with no attempt charged:
// it was never sent.
func TestALeaseTakenWithItsAnswerLostIsGivenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var armed atomic.Bool
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lossyConn{Conn: c, armed: &armed, match: "SET lease_token = $1::uuid"}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	startRelay(t, pool, nil)
	ep := outboxtest.Endpoint(t, pool, nil)
	armed.Store(true)
	outboxtest.Seed(t, pool, ep, 3, "")
	require.Eventually(t, func() bool { return !armed.Load() }, 10*time.Second, 10*time.Millisecond, "the lease's answer was lost")
	require.Eventually(t, func() bool {
		var attempted int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_attempts a JOIN outbox_messages m ON m.id = a.message_id
			WHERE m.destination = $1`, ep).Scan(&attempted))
		return attempted > 0
	}, 30*time.Second, 50*time.Millisecond, "the destination is served again")
	// The receiver is not there: each message's request fails once and
	// waits for its retry. The one claimed with the lost lease is sent
	// too, long before a claim timeout could release it.
	require.Eventually(t, func() bool {
		var unsent int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE destination = $1 AND attempts = 0`, ep).Scan(&unsent))
		return unsent == 0
	}, 30*time.Second, 50*time.Millisecond, "every message sent")
	rows, err := pool.Query(ctx, `SELECT attempts FROM outbox_messages WHERE destination = $1 ORDER BY id`, ep)
	require.NoError(t, err)
	attempts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{1, 1, 1}, attempts, "each message sent once: the lost lease's claim was released, not charged an attempt")
}

// lossyConn loses the answer to the first statement matching match that it
// sends once armed: the statement reaches the server (and commits), the
// answer never comes back, and the connection breaks.
type lossyConn struct {
	net.Conn
	match string
	armed *atomic.Bool
	mu    sync.Mutex
	stmt  []byte // the statement's prepared name on this connection
	lose  bool
}

func (c *lossyConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if b[0] == 'P' && bytes.Contains(b, []byte(c.match)) {
		// Parse: 'P', length (4 bytes), name NUL, query NUL.
		end := bytes.IndexByte(b[5:], 0)
		c.stmt = append(append([]byte{0}, b[5:5+end]...), 0)
	} else if b[0] == 'B' && c.stmt != nil && bytes.Contains(b, c.stmt) && c.armed.CompareAndSwap(true, false) {
		c.lose = true
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	lose := c.lose
	c.mu.Unlock()
	if lose {
		// Give the server the time to run and commit it, then break.
		time.Sleep(300 * time.Millisecond)
		c.Conn.Close()
		return 0, errors.New("connection reset (simulated)")
	}
	return c.Conn.Read(b)
}

// A lease taken over (its relay declared dead while it still ran) fences
// the old holder: a claim of the old job that runs while the takeover is
// in progress, or after it, claims nothing, so two jobs never have
// messages of one destination, or of one key, in flight at once. Before,
// the claim checked the lease in its own snapshot and claimed beside the
// new holder.
func TestALeaseTakenOverFencesTheOldHoldersClaims(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	q := outboxdb.New(pool)
	oldRelay, newRelay := uuid.New(), uuid.New()
	for _, id := range []uuid.UUID{oldRelay, newRelay} {
		_, err := q.RelayRegister(ctx, outboxdb.RelayRegisterParams{ID: id, Hostname: "h", Pid: 1, TimeoutSeconds: 5, ClaimTimeoutSeconds: 300})
		require.NoError(t, err)
	}
	oldToken := uuid.New()
	dest := outboxtest.Endpoint(t, pool, &oldToken)
	_, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET lease_relay = $1 WHERE id = $2`, oldRelay, dest)
	require.NoError(t, err)
	outboxtest.Seed(t, pool, dest, 4, "order-1")
	// The old relay falls silent: to the others it is dead.
	_, err = pool.Exec(ctx, `UPDATE outbox_relays SET heartbeat_at = now() - interval '1 minute' WHERE id = $1`, oldRelay)
	require.NoError(t, err)

	claim := func(token, relay uuid.UUID) []outboxdb.MessageClaimRow {
		rows, err := claimMessages(ctx, pool, outboxdb.MessageClaimParams{ClaimToken: token, RelayID: relay, Destination: dest, BatchSize: 10})
		require.NoError(t, err)
		return rows
	}
	takeover, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer takeover.Rollback(ctx) //nolint:errcheck
	newToken := uuid.New()
	tq := outboxdb.New(takeover)
	require.NoError(t, tq.DestinationLock(ctx, dest))
	_, err = tq.DestinationLease(ctx, newToken, newRelay, dest)
	require.NoError(t, err, "the new job takes the lease of a dead relay")
	old := make(chan []outboxdb.MessageClaimRow, 1)
	go func() { old <- claim(oldToken, oldRelay) }()
	waitForALockWait(t, pool, "the old job's claim waits for the takeover in progress")
	require.NoError(t, takeover.Commit(ctx))
	require.Empty(t, <-old, "then claims nothing: the lease is no longer its")
	require.Empty(t, claim(oldToken, oldRelay), "nor after it")
	rows := claim(newToken, newRelay)
	require.Len(t, rows, 1, "the new holder claims the key's first message")
}

// An endpoint moved to another destination while a deliver job serves the
// old one keeps the health its move reset: the job's end, which judged the
// old destination, frees the lease and leaves the new one's health alone.
// Before, the job wrote back the old destination's circuit, and the new
// one waited for a probe it had never earned.
func TestAnEndpointMovedWhileAJobServesItKeepsItsResetHealth(t *testing.T) {
	t.Parallel()
	pool, dest, lease := leased(t)
	ctx := context.Background()
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, slog.New(slog.DiscardHandler))
	moved := "http://127.0.0.1:2/hook"
	_, err := adm.UpdateEndpoint(ctx, dest, admin.EndpointChange{URL: &moved})
	require.NoError(t, err)
	until := time.Now().Add(time.Hour)
	why := "connection refused"
	_, err = outboxdb.New(pool).DestinationSettle(ctx, outboxdb.DestinationSettleParams{ID: dest, LeaseToken: lease,
		Url: outboxtest.EndpointURL, Health: outbox.HealthBackingOff, HealthReason: &why, ConsecutiveFailures: 5, BackoffUntil: &until})
	require.NoError(t, err)
	ep, err := adm.Endpoint(ctx, dest)
	require.NoError(t, err)
	require.Equal(t, outbox.HealthHealthy, ep.State, "the new destination is not judged by the old one's answers")
	require.Nil(t, ep.NextProbeAt)
	var leased bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_token IS NOT NULL FROM webhook_endpoints WHERE id = $1`, dest).Scan(&leased))
	require.False(t, leased, "the job's lease is freed all the same")
}
