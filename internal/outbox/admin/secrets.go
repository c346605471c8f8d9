package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/secretbox"
)

// Endpoint signing secrets (webhook_endpoints.secret and previous_secret)
// are sealed with the key ring when one is configured, each bound to its
// endpoint's id, so a database dump or a replica does not let its reader
// sign webhooks. The admin seals them at creation and rotation; the relay
// opens them when it signs. Without a ring they are stored in the clear.

// Option configures an Service beyond its required parts.
type Option func(*Service)

// WithSecretKeys makes the admin seal the signing secrets it writes with
// keys (its first key) and lets it re-encrypt them. Nil stores them in the
// clear, as without the option.
func WithSecretKeys(keys *secretbox.Keyring) Option {
	return func(a *Service) { a.keys = keys }
}

// sealSecret is the stored form of an endpoint's new secret.
func (a *Service) sealSecret(id uuid.UUID, secret string) (string, error) {
	sealed, err := a.keys.Seal(secret, id[:])
	if err != nil {
		return "", fmt.Errorf("encrypting secret: %w", err)
	}
	return sealed, nil
}

// reencryptBatch is how many endpoints one transaction of ReencryptSecrets
// locks and rewrites.
const reencryptBatch = 100

// ErrNoSecretKeys is returned by ReencryptSecrets when the admin has no key
// ring to encrypt with.
var ErrNoSecretKeys = errors.New("outbox: no secret keys are configured")

// ReencryptSecrets seals every endpoint's secrets under the ring's first key:
// those in the clear and those under an older key; a previous secret whose
// overlap is over is dropped instead. Rows already under the first key are
// left alone, so running it again changes nothing. It works in
// batches of endpoints, one transaction each, and returns how many endpoints
// it changed; on an error (a secret under a key the ring lacks) the batches
// before it are kept and running it again resumes.
func (a *Service) ReencryptSecrets(ctx context.Context) (int64, error) {
	if a.keys == nil {
		return 0, ErrNoSecretKeys
	}
	var changed int64
	after := uuid.Nil
	for {
		var n int
		err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			q := outboxdb.New(tx)
			rows, err := q.EndpointSecretsBatch(ctx, after, reencryptBatch)
			if err != nil {
				return fmt.Errorf("reading endpoint secrets: %w", err)
			}
			n = len(rows)
			for _, r := range rows {
				after = r.ID
				secret, ok, err := a.reseal(r.ID, r.Secret)
				if err != nil {
					return err
				}
				var previous *string
				if r.PreviousSecret != nil && r.PreviousExpired {
					// It no longer signs: dropped rather than kept, so it
					// needs no key (it may be under a key that is lost).
					ok = true
				} else if r.PreviousSecret != nil {
					p, pok, err := a.reseal(r.ID, *r.PreviousSecret)
					if err != nil {
						return err
					}
					previous, ok = &p, ok || pok
				}
				if !ok {
					continue
				}
				if err := q.EndpointSecretsSet(ctx, secret, previous, r.ID); err != nil {
					return fmt.Errorf("storing endpoint %s's secrets: %w", r.ID, err)
				}
				changed++
			}
			return nil
		})
		if err != nil {
			return changed, err
		}
		if n < reencryptBatch {
			break
		}
	}
	a.logger.InfoContext(ctx, "webhook secrets re-encrypted", slog.String("key_id", a.keys.Primary()),
		slog.Int64("endpoints_changed", changed))
	return changed, nil
}

// reseal returns stored sealed under the first key, and whether that
// changed it.
func (a *Service) reseal(id uuid.UUID, stored string) (string, bool, error) {
	if a.keys.Current(stored) {
		return stored, false, nil
	}
	plain, err := a.keys.Open(stored, id[:])
	if err != nil {
		return "", false, fmt.Errorf("decrypting endpoint %s's secret: %w", id, err)
	}
	sealed, err := a.sealSecret(id, plain)
	if err != nil {
		return "", false, err
	}
	return sealed, true, nil
}
