package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/dbtest"
	"github.com/outboxkit/orders/internal/netguard"
	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/secretbox"
	"github.com/outboxkit/orders/internal/webhook"
)

// testKey returns a fresh key entry "<id>:<base64>" and its base64.
func testKey(t *testing.T, id string) (entry, material string) {
	t.Helper()
	raw := make([]byte, secretbox.KeySize)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	material = base64.StdEncoding.EncodeToString(raw)
	return id + ":" + material, material
}

func keyring(t *testing.T, entries ...string) *secretbox.Keyring {
	t.Helper()
	k, err := secretbox.Parse(strings.Join(entries, ","))
	require.NoError(t, err)
	return k
}

// sealedAdmin is an admin of f's database that seals secrets with keys.
func (f fixture) sealedAdmin(keys *secretbox.Keyring) *admin.Service {
	return admin.New(f.pool, netguard.Guard{AllowPrivate: true}, discardLogger(), admin.WithSecretKeys(keys))
}

// stored returns an endpoint's secret and previous secret as the table has
// them.
func stored(t *testing.T, pool *pgxpool.Pool, ep admin.Endpoint) (secret string, previous *string) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT secret, previous_secret FROM webhook_endpoints WHERE id = $1", ep.ID).Scan(&secret, &previous))
	return secret, previous
}

// header returns the headers of the delivery of event that rc accepted.
func (rc *receiver) header(event uuid.UUID) http.Header {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.headers[event.String()]
}

func withKeys(cfg relay.Config, keys *secretbox.Keyring) relay.Config {
	cfg.SecretKeys = keys
	return cfg
}

func TestSealedSecretsSignDeliveries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k1, _ := testKey(t, "k1")
	keys := keyring(t, k1)
	adm := f.sealedAdmin(keys)
	rc := newReceiver(t)
	ep, err := adm.CreateEndpoint(ctx, rc.srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(ep.Secret, webhook.SecretPrefix), "the secret is returned in the clear at creation")
	rc.setSecret(ep.Secret)

	secret, previous := stored(t, f.pool, ep)
	require.True(t, strings.HasPrefix(secret, "enc:v1:k1:"), "the row holds the secret sealed under the first key, got %q", secret)
	require.NotContains(t, secret, strings.TrimPrefix(ep.Secret, webhook.SecretPrefix), "the row does not hold the secret")
	require.Nil(t, previous)

	f.startRelay(t, withKeys(fastConfig(), keys), nil)
	first := f.enqueue(t, "order.placed", 1)[0]
	eventually(t, func() bool { return f.status(t, first) == outbox.StatusDelivered },
		"delivered, signed with the secret returned at creation")

	rotated, err := adm.RotateSecret(ctx, ep.ID, time.Hour)
	require.NoError(t, err)
	secret, previous = stored(t, f.pool, ep)
	require.True(t, strings.HasPrefix(secret, "enc:v1:k1:"), "a rotated secret is sealed too")
	require.NotNil(t, previous)
	require.True(t, strings.HasPrefix(*previous, "enc:v1:k1:"), "the previous secret stays sealed")
	second := f.enqueue(t, "order.placed", 2)[0]
	eventually(t, func() bool { return f.status(t, second) == outbox.StatusDelivered }, "delivered after the rotation")
	h := rc.header(f.event(t, second))
	body := f.message(t, second).Body()
	onlyOld, err := webhook.NewVerifier(ep.Secret)
	require.NoError(t, err)
	onlyNew, err := webhook.NewVerifier(rotated.Secret)
	require.NoError(t, err)
	require.NoError(t, onlyOld.Verify(h, body), "during the overlap the previous secret, opened, still signs")
	require.NoError(t, onlyNew.Verify(h, body), "and the new one signs")
	require.Zero(t, rc.badSigned, "no delivery was signed with anything else")
}

// A secret sealed under a key the relay lacks is never replaced by anything:
// the delivery fails with an error that names the key, nothing reaches the
// receiver, and once the relay has the key the message is delivered.
func TestSecretUnderAnUnknownKeyIsNotSent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k1, _ := testKey(t, "k1")
	k2, _ := testKey(t, "k2")
	rc := newReceiver(t)
	ep, err := f.sealedAdmin(keyring(t, k1)).CreateEndpoint(ctx, rc.srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)
	rc.setSecret(ep.Secret)
	id := f.enqueue(t, "order.placed", 1)[0]

	for _, keys := range []*secretbox.Keyring{keyring(t, k2), nil} {
		cfg := withKeys(fastConfig(), keys)
		cfg.MaxAttempts = 1000 // the message waits for the key rather than failing
		cfg.ProbeIntervalMax = 50 * time.Millisecond
		rl := f.startRelay(t, cfg, nil)
		attempts := f.message(t, id).Attempts
		eventually(t, func() bool { return f.message(t, id).Attempts > attempts }, "the relay attempts the message")
		stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		require.NoError(t, rl.Stop(stopCtx))
		cancel()
		m := f.message(t, id)
		require.Equal(t, outbox.StatusPending, m.Status, "not delivered, and retried later")
		require.Contains(t, m.LastError, "cannot be decrypted", "last_error says why it was not sent")
		require.Contains(t, m.LastError, `"k1"`, "last_error names the key it needs")
	}
	rc.mu.Lock()
	requests := len(rc.attempts) + rc.badSigned
	rc.mu.Unlock()
	require.Zero(t, requests, "nothing was sent unsigned or signed with another secret")

	cfg := withKeys(fastConfig(), keyring(t, k2, k1))
	cfg.ProbeIntervalMax = 50 * time.Millisecond
	f.startRelay(t, cfg, nil)
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered once the relay has the key")
}

// The endpoint id is the associated data: a sealed secret copied into
// another endpoint's row does not open there.
func TestSealedSecretCopiedToAnotherEndpointDoesNotSign(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k1, _ := testKey(t, "k1")
	keys := keyring(t, k1)
	adm := f.sealedAdmin(keys)
	a, b := newReceiver(t), newReceiver(t)
	epA, err := adm.CreateEndpoint(ctx, a.srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)
	epB, err := adm.CreateEndpoint(ctx, b.srv.URL+"/hook", []string{"order.cancelled"})
	require.NoError(t, err)
	a.setSecret(epA.Secret)
	b.setSecret(epA.Secret) // B's receiver would accept A's secret: the forgery the copy attempts
	_, err = f.pool.Exec(ctx, "UPDATE webhook_endpoints SET secret = (SELECT secret FROM webhook_endpoints WHERE id = $1) WHERE id = $2",
		epA.ID, epB.ID)
	require.NoError(t, err)

	cfg := withKeys(fastConfig(), keys)
	cfg.MaxAttempts = 1000
	f.startRelay(t, cfg, nil)
	id := f.enqueue(t, "order.cancelled", 1)[0]
	eventually(t, func() bool { return f.message(t, id).Attempts > 0 }, "the relay attempts the message")
	m := f.message(t, id)
	require.NotEqual(t, outbox.StatusDelivered, m.Status)
	require.Contains(t, m.LastError, "cannot be decrypted", "a copied secret does not open under another endpoint's id")
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Zero(t, len(b.attempts)+b.badSigned, "nothing was sent with the copied secret")
}

// Rotating the key: with the new key first and the old one kept, old rows
// still open; re-encryption moves every row (in the clear or under the old
// key) to the new key, once; then the old key can go.
func TestReencryptSecretsMovesEveryRowToTheFirstKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	oldEntry, _ := testKey(t, "old")
	newEntry, _ := testKey(t, "new")

	clear := newReceiver(t)
	epClear, err := f.admin.CreateEndpoint(ctx, clear.srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)
	clear.setSecret(epClear.Secret)
	secret, _ := stored(t, f.pool, epClear)
	require.Equal(t, epClear.Secret, secret, "without keys the secret is stored in the clear")

	sealed := newReceiver(t)
	oldAdmin := f.sealedAdmin(keyring(t, oldEntry))
	epSealed, err := oldAdmin.CreateEndpoint(ctx, sealed.srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)
	rotated, err := oldAdmin.RotateSecret(ctx, epSealed.ID, time.Hour)
	require.NoError(t, err)
	sealed.setSecret(epSealed.Secret) // the receiver is still on the secret from creation
	// Enough rows in the clear for several batches.
	_, err = f.pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types, enabled)
		SELECT 'http://127.0.0.1:1/' || i, 'whsec_' || md5(i || random()::text), '{unused}', false
		FROM generate_series(1, 250) i`)
	require.NoError(t, err)

	_, err = f.admin.ReencryptSecrets(ctx)
	require.ErrorIs(t, err, admin.ErrNoSecretKeys, "re-encryption needs a key")

	both := f.sealedAdmin(keyring(t, newEntry, oldEntry))
	n, err := both.ReencryptSecrets(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 252, n, "every endpoint not under the first key is changed")
	var notNew int
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints
		WHERE secret NOT LIKE 'enc:v1:new:%' OR previous_secret NOT LIKE 'enc:v1:new:%'`).Scan(&notNew))
	require.Zero(t, notNew, "every secret and previous secret is under the new key")
	_, previous := stored(t, f.pool, epSealed)
	require.NotNil(t, previous, "re-encryption keeps the previous secret")
	n, err = both.ReencryptSecrets(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a second run changes nothing")

	// The old key removed: everything still signs, the rotation overlap too.
	newOnly := keyring(t, newEntry)
	f.startRelay(t, withKeys(fastConfig(), newOnly), nil)
	ids := f.enqueue(t, "order.placed", 1)
	require.Len(t, ids, 2)
	for _, id := range ids {
		eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered with the old key gone")
	}
	h := sealed.header(f.event(t, ids[1]))
	onlyNew, err := webhook.NewVerifier(rotated.Secret)
	require.NoError(t, err)
	require.NoError(t, onlyNew.Verify(h, f.message(t, ids[1]).Body()), "the rotated secret signs too")
	require.Zero(t, clear.badSigned+sealed.badSigned)

	_, err = f.sealedAdmin(keyring(t, oldEntry)).ReencryptSecrets(ctx)
	require.ErrorIs(t, err, secretbox.ErrUnknownKey, "re-encrypting with a ring that lacks the rows' key fails")
	require.ErrorContains(t, err, `"new"`, "naming the key")
}

// With a key set, a pg_dump of the database holds no secret and no key: the
// sealed rows only. An endpoint written without a key shows the check works.
func TestPgDumpHoldsNoSecret(t *testing.T) {
	t.Parallel()
	pgDump, err := exec.LookPath("pg_dump")
	if err != nil {
		t.Skip("pg_dump is not installed")
	}
	url := dbtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	entry, material := testKey(t, "k1")
	adm := admin.New(pool, netguard.Guard{AllowPrivate: true}, discardLogger(), admin.WithSecretKeys(keyring(t, entry)))
	ep, err := adm.CreateEndpoint(ctx, "http://127.0.0.1:1/hook", []string{"order.placed"})
	require.NoError(t, err)
	rotated, err := adm.RotateSecret(ctx, ep.ID, time.Hour)
	require.NoError(t, err)
	control, err := admin.New(pool, netguard.Guard{AllowPrivate: true}, discardLogger()).
		CreateEndpoint(ctx, "http://127.0.0.1:2/hook", []string{"order.placed"})
	require.NoError(t, err)

	out, err := exec.Command(pgDump, "--no-owner", "--dbname="+url).CombinedOutput()
	require.NoError(t, err, "pg_dump: %s", out)
	dump := string(out)
	require.Contains(t, dump, strings.TrimPrefix(control.Secret, webhook.SecretPrefix),
		"the dump holds a secret written without a key: the search below can find one")
	require.Equal(t, 2, strings.Count(dump, "enc:v1:k1:"), "the dump holds the sealed secret and previous secret")
	for name, s := range map[string]string{"first secret (now the previous)": ep.Secret, "rotated secret": rotated.Secret} {
		require.NotContains(t, dump, strings.TrimPrefix(s, webhook.SecretPrefix), "the dump does not hold the %s", name)
	}
	require.NotContains(t, dump, material, "the dump does not hold the key")
	require.NotContains(t, dump, strings.TrimRight(material, "="), "the dump does not hold the key, padded or not")
}

// HTTP: the admin API's creation answers the secret in the clear while the
// row holds it sealed.
func TestAdminAPIReturnsTheSecretInTheClear(t *testing.T) {
	t.Parallel()
	f := setup(t)
	k1, _ := testKey(t, "k1")
	adm := f.sealedAdmin(keyring(t, k1))
	srv := httptest.NewServer(adm.Handler())
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/webhook-endpoints", "application/json",
		strings.NewReader(`{"url":"http://127.0.0.1:1/hook","event_types":["order.placed"]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var ep admin.Endpoint
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ep))
	require.True(t, strings.HasPrefix(ep.Secret, webhook.SecretPrefix), "the client gets the usable secret")
	secret, _ := stored(t, f.pool, ep)
	require.True(t, strings.HasPrefix(secret, "enc:v1:k1:"), "the row holds it sealed")
}

// A lost key loses the secrets under it, not the endpoint: rotating its
// secret without overlap under the current key makes it deliverable again,
// and re-encryption drops the previous secret it can no longer read.
func TestLostKeyRecoveredByRotation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	lost, _ := testKey(t, "lost")
	current, _ := testKey(t, "current")
	rc := newReceiver(t)
	ep, err := f.sealedAdmin(keyring(t, lost)).CreateEndpoint(ctx, rc.srv.URL+"/hook", []string{"order.placed"})
	require.NoError(t, err)

	keys := keyring(t, current)
	adm := f.sealedAdmin(keys)
	rotated, err := adm.RotateSecret(ctx, ep.ID, 0)
	require.NoError(t, err)
	rc.setSecret(rotated.Secret)
	n, err := adm.ReencryptSecrets(ctx)
	require.NoError(t, err, "the previous secret under the lost key has expired: it is dropped, not decrypted")
	require.EqualValues(t, 1, n)
	_, previous := stored(t, f.pool, ep)
	require.Nil(t, previous, "the expired previous secret is gone")

	f.startRelay(t, withKeys(fastConfig(), keys), nil)
	id := f.enqueue(t, "order.placed", 1)[0]
	eventually(t, func() bool { return f.status(t, id) == outbox.StatusDelivered }, "delivered with the new secret")
	require.Zero(t, rc.badSigned)
}

// A creation repeated under its id never shows a secret other than the one
// it made: once rotated, the id is a conflict even after reencrypt-secrets
// dropped the previous secret whose overlap ended, which erased the sign of
// the rotation it went by.
func TestCreateEndpointOnceNeverShowsARotatedSecret(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	k1, _ := testKey(t, "k1")
	adm := f.sealedAdmin(keyring(t, k1))
	id := uuid.New()
	first, err := adm.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.NoError(t, err)
	rotated, err := adm.RotateSecret(ctx, id, 0)
	require.NoError(t, err)
	_, err = adm.ReencryptSecrets(ctx)
	require.NoError(t, err)
	_, previous := stored(t, f.pool, first)
	require.Nil(t, previous, "the ended overlap's secret is dropped")

	again, err := adm.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.ErrorIs(t, err, admin.ErrConflict)
	require.Empty(t, again.Secret)
	require.NotEqual(t, first.Secret, rotated.Secret)
}

// A creation repeated long after the first (past the minutes a retry or a
// double click takes) is a conflict: an id learnt later shows no secret.
func TestCreateEndpointOnceAnswersARepeatOnlySoonAfter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	id := uuid.New()
	_, err := f.admin.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, `UPDATE webhook_endpoints SET created_at = created_at - interval '11 minutes',
		updated_at = created_at - interval '11 minutes' WHERE id = $1`, id)
	require.NoError(t, err)
	again, err := f.admin.CreateEndpointOnce(ctx, id, "http://127.0.0.1:9/hook", []string{"order.placed"})
	require.ErrorIs(t, err, admin.ErrConflict)
	require.Empty(t, again.Secret)
}
