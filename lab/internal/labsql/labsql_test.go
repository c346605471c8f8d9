package labsql

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQueryNumbersParametersInOrderOfFirstUse(t *testing.T) {
	s := number(`SELECT @b::uuid, sqlc.narg(a)::jsonb, @b, sqlc.arg(c) WHERE x = 'no@param'`)
	require.Equal(t, `SELECT $1::uuid, $2::jsonb, $1, $3 WHERE x = 'no$4'`, s.SQL, "a quoted @ is not expected in the product's queries")
	require.Equal(t, []string{"b", "a", "c", "param"}, s.Params)
}

// The lab's statements are found, complete, in the product's query files.
func TestTheLabsStatementsExist(t *testing.T) {
	for _, q := range []struct{ module, name string }{
		{"outbox", "MessageClaim"}, {"outbox", "MessageEnqueue"},
		{"orders", "OrderInsert"}, {"orders", "OrderLinesInsert"},
	} {
		s, err := Query(q.module, q.name)
		require.NoError(t, err)
		require.NotContains(t, s.SQL, "-- name:")
		require.NotContains(t, s.SQL, "@")
		require.NotEmpty(t, s.Params)
	}
	claim := MustQuery("outbox", "MessageClaim")
	require.Equal(t, []string{"destination", "claim_token", "batch_size", "relay_id"}, claim.Params)
	args, err := claim.Args(map[string]any{"destination": 1, "claim_token": 2, "batch_size": 3, "relay_id": 4})
	require.NoError(t, err)
	require.Equal(t, []any{1, 2, 3, 4}, args)
	_, err = claim.Args(map[string]any{"destination": 1})
	require.ErrorContains(t, err, "claim_token")
	_, err = Query("outbox", "NoSuchQuery")
	require.Error(t, err)
}
