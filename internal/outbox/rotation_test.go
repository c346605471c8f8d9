package outbox_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/webhook"
)

// During a rotation's overlap every delivery verifies with the old secret
// and with the new one; after it, only with the new one.
func TestRotateSecretSignsWithBothSecretsDuringTheOverlap(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rc := newReceiver(t)
	var mu sync.Mutex
	var headers []http.Header
	var bodies [][]byte
	rc.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		headers = append(headers, r.Header.Clone())
		bodies = append(bodies, body)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	ep := f.endpoint(t, rc, "order.placed")
	oldSecret := ep.Secret

	rotated, err := f.admin.RotateSecret(ctx, ep.ID, time.Hour)
	require.NoError(t, err)
	require.NotEqual(t, oldSecret, rotated.Secret)
	require.True(t, strings.HasPrefix(rotated.Secret, "whsec_"))
	listed, err := f.admin.Endpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Empty(t, listed.Secret, "secrets are shown once, never listed")

	f.startRelay(t, fastConfig(), nil)
	first := f.enqueue(t, "order.placed", 1)[0]
	eventually(t, func() bool { return f.status(t, first) == outbox.StatusDelivered }, "delivered during the overlap")

	onlyOld, err := webhook.NewVerifier(oldSecret)
	require.NoError(t, err)
	onlyNew, err := webhook.NewVerifier(rotated.Secret)
	require.NoError(t, err)
	mu.Lock()
	h, b := headers[0], bodies[0]
	mu.Unlock()
	require.Len(t, strings.Fields(h.Get(webhook.HeaderSignature)), 2, "one signature per secret")
	require.NoError(t, onlyOld.Verify(h, b), "a receiver still on the old secret verifies")
	require.NoError(t, onlyNew.Verify(h, b), "a receiver on the new secret verifies")

	// The overlap ends.
	_, err = f.pool.Exec(ctx, "UPDATE webhook_endpoints SET previous_secret_expires_at = now() - interval '1 second' WHERE id = $1", ep.ID)
	require.NoError(t, err)
	second := f.enqueue(t, "order.placed", 2)[0]
	eventually(t, func() bool { return f.status(t, second) == outbox.StatusDelivered }, "delivered after the overlap")
	mu.Lock()
	h, b = headers[len(headers)-1], bodies[len(bodies)-1]
	mu.Unlock()
	require.Len(t, strings.Fields(h.Get(webhook.HeaderSignature)), 1)
	require.ErrorIs(t, onlyOld.Verify(h, b), webhook.ErrNoMatchingSignature, "the old secret no longer signs")
	require.NoError(t, onlyNew.Verify(h, b))

	_, err = f.admin.RotateSecret(ctx, ep.ID, -time.Second)
	require.ErrorIs(t, err, admin.ErrInvalidEndpoint)
}
