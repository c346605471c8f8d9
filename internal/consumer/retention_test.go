package consumer_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/consumer"
)

// inboxRetention is the retention the tests' consumer is told of.
const inboxRetention = 30 * 24 * time.Hour

// placedAt is the body of an order.placed event written at at.
func placedAt(t *testing.T, id string, at time.Time) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"id": id, "type": consumer.EventPlaced, "created_at": at.UTC().Format(time.RFC3339Nano),
		"data": orderData(consumer.EventPlaced, "c-1", uuid.New(), 100)})
	require.NoError(t, err)
	return b
}

// An event written longer ago than the inbox remembers ids, and not in
// the inbox, may have been applied and forgotten since: it is refused (422,
// nothing written), counted and logged as an error, not applied a second
// time. One still in the inbox is the duplicate it is; one inside the
// retention is applied.
func TestEventsOlderThanTheInboxRetentionAreRefused(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	f := setupWith(t, []consumer.Option{consumer.WithInboxRetention(inboxRetention)}, secret)
	old := time.Now().Add(-inboxRetention - time.Hour)

	id := uuid.NewString()
	code, outcome := post(t, f.url, secret, id, time.Now(), placedAt(t, id, old))
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Equal(t, consumer.TooOld, outcome, "an event older than the inbox's memory is not applied: it may be a second time")
	f.requireNothingWritten(t)
	require.EqualValues(t, 1, f.stats(t).TooOld, "counted")
	f.mu.Lock()
	require.Contains(t, f.logs.String(), `"msg":"event older than the inbox retention refused"`, "logged")
	require.Contains(t, f.logs.String(), `"level":"ERROR"`, "as an error: an event lost to the consumer unless someone looks")
	f.mu.Unlock()

	// One whose id the inbox still holds (an event received late in the
	// sender's retries) is a duplicate, acknowledged.
	remembered := uuid.NewString()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO consumer_inbox (webhook_id, event_type) VALUES ($1, 'order.placed')`, remembered)
	require.NoError(t, err)
	code, outcome = post(t, f.url, secret, remembered, time.Now(), placedAt(t, remembered, old))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Duplicate, outcome)

	recent := uuid.NewString()
	code, outcome = post(t, f.url, secret, recent, time.Now(), placedAt(t, recent, time.Now().Add(-inboxRetention+time.Hour)))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, consumer.Applied, outcome, "inside the retention, applied")
}
