package relayworker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The brokers' settings have a table of their own in docs/reference.md,
// generated as the worker's is (go test ./internal/relayworker -update).
func TestBrokerSettingsDocIsCurrent(t *testing.T) {
	requireGenerated(t, "broker settings", settingsTable(brokerSettings))
}

// A broker URL that does not parse stops the worker at start, naming its
// variable and not quoting the value, which may hold a password.
func TestBrokerURLsAreCheckedAtStartWithoutQuotingThem(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]string{
		"OUTBOX_NATS_URL": "nats://relay:s3cr%zz@127.0.0.1:4222",
		"OUTBOX_AMQP_URL": "amqp://relay:s3cr%zz@127.0.0.1:5672/",
	} {
		env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x", name: v}
		_, err := parseConfig(func(k string) string { return env[k] }, nil)
		require.ErrorContains(t, err, name)
		require.NotContains(t, err.Error(), "s3cr")
	}
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1/x",
		"OUTBOX_NATS_URL": "nats://relay:secret@127.0.0.1:4222", "OUTBOX_AMQP_URL": "amqp://relay:secret@127.0.0.1:5672/"}
	_, err := parseConfig(func(k string) string { return env[k] }, nil)
	require.NoError(t, err)
}
