package relay

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/outbox/outboxtest"
)

// A job's end says whether its destination has work due, in the settle's
// transaction, so that the relay wakes the dispatch for the worker it
// frees rather than leaving the work to the next poll. A job whose lease
// was taken from it says nothing is due: whoever holds the lease decides.
func TestAJobsEndSaysWhetherWorkIsDue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		seeded int
		lost   bool
		want   bool
	}{
		{name: "a message of its destination is left", seeded: 2, want: true},
		{name: "nothing is left", seeded: 1, want: false},
		{name: "its lease was taken from it", seeded: 2, lost: true, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, dest, lease := leased(t)
			ctx := context.Background()
			outboxtest.Seed(t, pool, dest, tc.seeded, "")
			s, rows := claimedSession(t, pool, dest, lease, 1)
			require.Len(t, rows, 1)
			if tc.lost {
				token := uuid.New()
				s.token, s.rec = token, newRecorder(s.r, dest, token)
			}
			s.ep = outboxdb.DestinationLeaseRow{Url: outboxtest.EndpointURL}
			s.rec.record(judged(s.r.cfg, rows[0], Result{StatusCode: http.StatusNoContent}))

			var due bool
			var recorded []outcome
			require.NoError(t, s.settleWrite(ctx, s.rec.pending, &recorded, &due, outbox.HealthHealthy, nil, nil, 0))
			require.Equal(t, tc.want, due)
			var held bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT lease_token IS NOT NULL FROM webhook_endpoints WHERE id = $1`, dest).Scan(&held))
			require.Equal(t, tc.lost, held, "the job's end frees its own lease only")
			if !tc.lost {
				require.Len(t, recorded, 1, "the job's outcome is recorded")
			}
		})
	}
}
