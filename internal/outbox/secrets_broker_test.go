package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/broker"
	"github.com/outboxkit/orders/internal/brokertest"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/relay"
)

// A broker destination signs nothing, so the relay never opens its secret:
// one sealed under a key this relay lacks holds none of its messages.
func TestBrokerDestinationNeverOpensItsSecret(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k1, _ := testKey(t, "k1")
	k2, _ := testKey(t, "k2")
	_, js := brokertest.JetStream(t)
	stream, subject := brokertest.Stream(t, js, "secretstest", 0)
	_, err := f.sealedAdmin(keyring(t, k1)).CreateEndpoint(ctx, "nats:"+subject, []string{"order.placed"})
	require.NoError(t, err)
	id := f.enqueue(t, "order.placed", 1)[0]

	f.startRelay(t, withKeys(fastConfig(), keyring(t, k2)), relay.Router{
		destination.KindNATS: broker.NewNATS(brokertest.NATSURL(), "urn:test:orders")})
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered to the stream")
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs)
	require.Equal(t, 1, f.message(t, id).Attempts, "on its first attempt")
}
