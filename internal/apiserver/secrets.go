package apiserver

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/secretbox"
)

// secretsInClear is logged at start, and shown on every ops page, while no
// key encrypts the webhook signing secrets.
const secretsInClear = "OUTBOX_SECRET_KEYS is not set: webhook signing secrets are stored in the clear, " +
	"so whoever reads a database dump or replica can sign webhooks (docs/operations.md)"

// parseSecretKeys reads OUTBOX_SECRET_KEYS, the key ring that encrypts the
// signing secrets (the worker reads the same variable to decrypt them).
func parseSecretKeys(env *process.Env) *secretbox.Keyring {
	keys, err := secretbox.Parse(env.String("OUTBOX_SECRET_KEYS", ""))
	if err != nil {
		env.Fail("OUTBOX_SECRET_KEYS", err)
	}
	return keys
}

// warnings are what the api says at start and the ops page shows on every
// page about its configuration.
func (c config) warnings() []string {
	var w []string
	if c.secretKeys == nil {
		w = append(w, secretsInClear)
	}
	if c.adminToken != "" && !c.opsCookieSecure && !process.LoopbackOnly(c.adminListener()) {
		// The api serves no TLS itself, so without the setting the session
		// cookie is never Secure: a browser would send it over plain HTTP
		// to whoever can make it ask.
		w = append(w, "OPS_COOKIE_SECURE is not set and the ops page listens on "+c.adminListener()+
			": its session cookie is not marked Secure; behind a proxy that terminates TLS set OPS_COOKIE_SECURE=true (docs/operations.md)")
	}
	if len(c.allowedHosts) == 0 && (!process.LoopbackOnly(c.addr) || c.adminAddr != "" && !process.LoopbackOnly(c.adminAddr)) {
		// Beyond loopback clients usually reach the api by a name, which
		// is refused until it is listed: say so before the first 421.
		w = append(w, "API_ALLOWED_HOSTS is not set: requests that reach the api by a name (Host: api.example.com) are answered 421, "+
			"only its IP addresses and localhost are accepted; list the names clients use (docs/operations.md)")
	}
	return w
}

// reencryptSecrets is `api reencrypt-secrets`: it seals every endpoint's
// signing secrets under the first key of OUTBOX_SECRET_KEYS.
func reencryptSecrets(ctx context.Context, pool *pgxpool.Pool, keys *secretbox.Keyring, logger *slog.Logger) error {
	if keys == nil {
		return errors.New("reencrypt-secrets: OUTBOX_SECRET_KEYS is not set: there is no key to encrypt with")
	}
	_, err := admin.New(pool, nil, logger, admin.WithSecretKeys(keys)).ReencryptSecrets(ctx)
	return err
}
