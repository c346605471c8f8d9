package webhook_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/webhook"
)

// The hand-written body is the same JSON json.Marshal would write.
func TestWebhookBodyMatchesTheEnvelope(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	at := time.Date(2026, 11, 29, 21, 0, 46, 511808000, time.UTC)
	data := json.RawMessage(`{"id": "o-1", "total_cents": 1000, "note": "\u00e9\"x"}`)
	got := webhook.Body(id, `order."placed"`, at, data)
	require.True(t, json.Valid(got), string(got))
	want, err := json.Marshal(struct {
		ID        uuid.UUID       `json:"id"`
		Type      string          `json:"type"`
		CreatedAt time.Time       `json:"created_at"`
		Data      json.RawMessage `json:"data"`
	}{id, `order."placed"`, at, data})
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got))
}
