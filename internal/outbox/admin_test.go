package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

func TestMessagesFilterAndPaginate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a, b := newReceiver(t), newReceiver(t)
	epA := f.endpoint(t, a, "order.placed", "order.cancelled")
	f.endpoint(t, b, "order.placed")
	var placed []uuid.UUID
	for i := range 7 {
		placed = append(placed, f.enqueue(t, "order.placed", i)...)
	}
	cancelled := f.enqueue(t, "order.cancelled", "x")
	require.Len(t, placed, 14)
	require.Len(t, cancelled, 1)

	// Pages of 5, newest first, cover everything exactly once.
	var seen []uuid.UUID
	var cursor *uuid.UUID
	for {
		page, next, err := f.admin.Messages(ctx, admin.MessageFilter{Limit: 5, Before: cursor})
		require.NoError(t, err)
		for _, m := range page {
			seen = append(seen, m.ID)
		}
		if next == nil {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 15)
	for i := 1; i < len(seen); i++ {
		require.Less(t, seen[i].String(), seen[i-1].String(), "newest first")
	}
	// After reads the page just newer than a message, newest first too:
	// back up from the oldest, the same pages.
	for end := len(seen) - 1; end > 0; end -= 5 {
		start := max(end-5, 0)
		page, _, err := f.admin.Messages(ctx, admin.MessageFilter{Limit: 5, After: &seen[end]})
		require.NoError(t, err)
		var got []uuid.UUID
		for _, m := range page {
			got = append(got, m.ID)
		}
		require.Equal(t, seen[start:end], got, "the page newer than %s", seen[end])
	}

	byType, _, err := f.admin.Messages(ctx, admin.MessageFilter{Type: "order.cancelled"})
	require.NoError(t, err)
	require.Len(t, byType, 1)
	require.Equal(t, cancelled[0], byType[0].ID)

	byEndpoint, _, err := f.admin.Messages(ctx, admin.MessageFilter{Destination: &epA.ID})
	require.NoError(t, err)
	require.Len(t, byEndpoint, 8)

	future := time.Now().Add(time.Hour)
	none, _, err := f.admin.Messages(ctx, admin.MessageFilter{CreatedFrom: &future})
	require.NoError(t, err)
	require.Empty(t, none)
	// A window that ends before 1970 holds nothing, whatever ids can hold.
	for _, to := range []time.Time{time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC), time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)} {
		none, _, err = f.admin.Messages(ctx, admin.MessageFilter{CreatedTo: &to})
		require.NoError(t, err)
		require.Empty(t, none, "to %s", to)
		none, _, err = f.admin.Messages(ctx, admin.MessageFilter{OrderingKey: "order-1", CreatedTo: &to})
		require.NoError(t, err)
		require.Empty(t, none, "to %s, by key", to)
	}

	// After by key: the key's messages newer than its oldest.
	for i := range 3 {
		f.publish(t, outbox.Event{Type: "order.placed", OrderingKey: "k-after", Data: i})
	}
	keyed, _, err := f.admin.Messages(ctx, admin.MessageFilter{OrderingKey: "k-after"})
	require.NoError(t, err)
	require.Len(t, keyed, 6, "three events, each to both endpoints")
	newer, _, err := f.admin.Messages(ctx, admin.MessageFilter{OrderingKey: "k-after", After: &keyed[len(keyed)-1].ID})
	require.NoError(t, err)
	require.Equal(t, keyed[:len(keyed)-1], newer, "the key's messages newer than its oldest, newest first")

	_, _, err = f.admin.Messages(ctx, admin.MessageFilter{Status: "lost"})
	require.ErrorIs(t, err, admin.ErrInvalidStatus)
}

// A destination PostgreSQL cannot store as text (a NUL in a subject or a
// routing key, bytes that are not UTF-8 in a URL's path) is refused as
// invalid, not answered with a database error, and writes nothing.
func TestDestinationsThatAreNotTextAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ep := f.endpoint(t, newReceiver(t), "order.placed")
	for _, u := range []string{"nats:orders.a\x00b", "rabbitmq:orders/order.placed\x00", "http://127.0.0.1:9/\xff"} {
		_, err := f.admin.CreateEndpoint(ctx, u, []string{"order.placed"})
		require.ErrorIs(t, err, admin.ErrInvalidEndpoint, "%q", u)
		_, err = f.admin.UpdateEndpoint(ctx, ep.ID, admin.EndpointChange{URL: &u})
		require.ErrorIs(t, err, admin.ErrInvalidEndpoint, "%q", u)
	}
	eps, err := f.admin.Endpoints(ctx)
	require.NoError(t, err)
	require.Len(t, eps, 1, "nothing written")
	require.Equal(t, ep.URL, eps[0].URL, "nothing changed")
}

// Registrations beyond the bounds are refused with a reason and write
// nothing: an incompressible event type of 6,000 characters was too long
// for the subscription index's entries, and answered 500.
func TestOversizedRegistrationsAreRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	ep := f.endpoint(t, newReceiver(t), "order.placed")
	random := func(n int) string {
		b := make([]byte, n/2)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("order.type%d", i)
	}
	for name, types := range map[string][]string{
		"a long type": {random(6000)}, "101 types": many, "a type with a space around it": {" order.placed"},
	} {
		_, err := f.admin.CreateEndpoint(ctx, ep.URL, types)
		require.ErrorIs(t, err, admin.ErrInvalidEndpoint, name)
		_, err = f.admin.UpdateEndpoint(ctx, ep.ID, admin.EndpointChange{EventTypes: types})
		require.ErrorIs(t, err, admin.ErrInvalidEndpoint, name)
	}
	long := ep.URL + "?" + random(3000)
	_, err := f.admin.CreateEndpoint(ctx, long, []string{"order.placed"})
	require.ErrorIs(t, err, admin.ErrInvalidEndpoint, "a long URL")
	eps, err := f.admin.Endpoints(ctx)
	require.NoError(t, err)
	require.Len(t, eps, 1, "nothing written")
	require.Equal(t, []string{"order.placed"}, eps[0].EventTypes, "nothing changed")
}

// An ordering key's messages found from a time before 1970, where no event
// id can lie, are all of its messages, not none.
func TestMessagesOfAKeyFromBeforeTheEpoch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.endpoint(t, newReceiver(t), "order.placed")
	f.publish(t, outbox.Event{Type: "order.placed", Data: 1, OrderingKey: "order-1"})
	from := time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC)
	msgs, _, err := f.admin.Messages(ctx, admin.MessageFilter{OrderingKey: "order-1", CreatedFrom: &from})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
}

// A creation repeated under its id makes nothing new and answers with the
// endpoint and secret the first one made; once the secret was rotated, or
// for another URL, the id is a conflict.
func TestCreateEndpointOnceUnderOneID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	id := uuid.New()
	first, err := f.admin.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.NoError(t, err)
	again, err := f.admin.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.NoError(t, err)
	require.Equal(t, first.Secret, again.Secret, "the first one's secret")
	require.Equal(t, first.ID, again.ID)
	_, err = f.admin.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/other", []string{"order.placed"})
	require.ErrorIs(t, err, admin.ErrConflict, "another URL")
	_, err = f.admin.RotateSecret(ctx, id, time.Hour)
	require.NoError(t, err)
	_, err = f.admin.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.ErrorIs(t, err, admin.ErrConflict, "the secret it showed is no longer the one that signs")
	eps, err := f.admin.Endpoints(ctx)
	require.NoError(t, err)
	require.Len(t, eps, 1)
}
