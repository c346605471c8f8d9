package brokertest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// flakyStore answers CreateStream with the server's "error creating store"
// a number of times, then with its other answer: the race of a create with
// the deletion of an account's last stream, which a test cannot make the
// server lose on purpose.
type flakyStore struct {
	jetstream.JetStream
	storeFailures int
	then          error
	calls         int
}

func (f *flakyStore) CreateStream(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) {
	f.calls++
	if f.calls <= f.storeFailures {
		return nil, &jetstream.APIError{Code: 500, ErrorCode: streamStoreFailed, Description: "error creating store for stream"}
	}
	return nil, f.then
}

func TestCreateStreamTriesAgainWhileTheStoreCannotBeCreated(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := &flakyStore{storeFailures: 3}
	_, err := CreateStream(ctx, f, jetstream.StreamConfig{Name: "S"})
	require.NoError(t, err, "created once the store could be")
	require.Equal(t, 4, f.calls)

	inUse := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamNameInUse, Description: "stream name already in use"}
	f = &flakyStore{then: inUse}
	_, err = CreateStream(ctx, f, jetstream.StreamConfig{Name: "S"})
	require.ErrorIs(t, err, inUse, "any other refusal is the answer")
	require.Equal(t, 1, f.calls)

	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	f = &flakyStore{storeFailures: 1 << 30}
	_, err = CreateStream(short, f, jetstream.StreamConfig{Name: "S"})
	require.ErrorContains(t, err, "error creating store", "a store that never comes gives up with the context")
}
