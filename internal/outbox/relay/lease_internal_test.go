package relay

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A lease whose taking committed but whose answer was lost (the connection
// broke at that moment) is given back: the job saw an error, and a lease
// held by its own live relay kept every later job of the destination away
// for as long as the relay lived, its messages never sent.
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
