// Package webhook signs outgoing and verifies incoming webhook deliveries
// following the Standard Webhooks specification (https://www.standardwebhooks.com),
// so that receivers can use any off-the-shelf Standard Webhooks library to
// authenticate our deliveries and reject replays.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names and the secret prefix are fixed by the specification; they are
// exported so that senders, receivers and tests never spell them differently.
const (
	// HeaderID carries the message ID, which receivers use for idempotency and
	// which is bound into the signature so it cannot be swapped.
	HeaderID = "webhook-id"
	// HeaderTimestamp carries the send time in Unix seconds; it is signed so
	// that receivers can reject replays of old deliveries.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature carries one or more space-separated "v1,<base64>"
	// signatures; several are sent while a secret is being rotated.
	HeaderSignature = "webhook-signature"
	// SecretPrefix marks a string as a Standard Webhooks secret, which keeps
	// secrets recognisable in configuration and to secret scanners.
	SecretPrefix = "whsec_"
)

// DefaultTolerance is how far a delivery's timestamp may be from the
// receiver's clock; the specification recommends five minutes as a balance
// between clock skew and the replay window.
const DefaultTolerance = 5 * time.Minute

// secretKeySize is 256 bits, matching the output size of HMAC-SHA256.
const secretKeySize = 32

// signatureVersion is the only scheme this package produces or accepts;
// other versions (e.g. asymmetric "v1a") are skipped rather than rejected so
// that senders can add schemes without breaking us.
const signatureVersion = "v1"

// Sentinel errors let callers map verification failures to responses or
// metrics with errors.Is, while the wrapped message keeps the detail for logs.
var (
	// ErrInvalidSecret means a secret is not a well-formed "whsec_" secret.
	ErrInvalidSecret = errors.New("webhook: invalid secret")
	// ErrMissingHeaders means at least one required webhook header is absent.
	ErrMissingHeaders = errors.New("webhook: missing headers")
	// ErrInvalidTimestamp means the timestamp header is not decimal Unix seconds.
	ErrInvalidTimestamp = errors.New("webhook: invalid timestamp")
	// ErrTimestampOutOfTolerance means the delivery is too old or too far in
	// the future and may be a replay.
	ErrTimestampOutOfTolerance = errors.New("webhook: timestamp outside tolerance")
	// ErrNoMatchingSignature means no v1 signature matched any accepted secret.
	ErrNoMatchingSignature = errors.New("webhook: no matching signature")
)

// NewSecret generates a fresh secret for a new endpoint, in the textual form
// that is stored and shown to the endpoint owner.
func NewSecret() (string, error) {
	key := make([]byte, secretKeySize)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("generating secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(key), nil
}

// ParseSecret turns the textual secret into the HMAC key. It is strict about
// the prefix so that a value pasted into the wrong setting fails loudly
// instead of silently producing signatures nobody can verify.
func ParseSecret(secret string) ([]byte, error) {
	encoded, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("parsing secret: %w: missing %q prefix", ErrInvalidSecret, SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return nil, fmt.Errorf("decoding secret: %w: %w", ErrInvalidSecret, err)
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("parsing secret: %w: empty key", ErrInvalidSecret)
	}
	return key, nil
}

// Sign computes the signature header value for a single key. It is exposed
// for callers that manage keys themselves; most code should use a Signer.
func Sign(key []byte, id string, ts time.Time, body []byte) string {
	var buf [20]byte // enough for any int64 in decimal
	return encodeSignature(mac(key, id, strconv.AppendInt(buf[:0], ts.Unix(), 10), body))
}

// mac computes HMAC-SHA256 over "{id}.{timestamp}.{body}" without
// concatenating, so large bodies are not copied. The timestamp is taken as the
// exact bytes that travel in the header, which is what the receiver signs.
func mac(key []byte, id string, ts []byte, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write(ts)
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

func encodeSignature(sum []byte) string {
	return signatureVersion + "," + base64.StdEncoding.EncodeToString(sum)
}

// Signer signs deliveries for one endpoint. It decodes the secret once so the
// delivery hot path does no parsing, and is safe for concurrent use.
type Signer struct {
	key []byte
}

// NewSigner validates the endpoint secret up front so that a bad secret is
// reported when the endpoint is loaded, not on every delivery.
func NewSigner(secret string) (*Signer, error) {
	key, err := ParseSecret(secret)
	if err != nil {
		return nil, fmt.Errorf("creating signer: %w", err)
	}
	return &Signer{key: key}, nil
}

// Sign returns the signature header value for one delivery.
func (s *Signer) Sign(id string, ts time.Time, body []byte) string {
	return Sign(s.key, id, ts, body)
}

// SetHeaders writes every header a Standard Webhooks receiver needs, so the
// signed timestamp and the transmitted timestamp can never disagree.
func (s *Signer) SetHeaders(h http.Header, id string, ts time.Time, body []byte) {
	h.Set("Content-Type", "application/json")
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, s.Sign(id, ts, body))
}

// Verifier authenticates incoming deliveries. It accepts several secrets so
// that a receiver keeps working while the sender rotates from old to new.
// A Verifier must not be modified while Verify may run concurrently.
type Verifier struct {
	keys [][]byte

	// Tolerance bounds the difference between the delivery timestamp and Now
	// in either direction, at the header's one-second resolution; zero or
	// negative means DefaultTolerance, so a forgotten setting never disables
	// replay protection.
	Tolerance time.Duration
	// Now is the clock used for the tolerance check; nil means time.Now.
	// It exists so tests can verify fixed vectors deterministically.
	Now func() time.Time
}

// MinVerifierKey is the shortest key a Verifier accepts, in bytes: the
// Standard Webhooks minimum. A receiver's secrets come from its operator's
// configuration, and a short key would let anyone who tries enough keys
// forge its webhooks.
const MinVerifierKey = 24

// NewVerifier builds a Verifier that accepts signatures made with any of the
// given secrets, each of at least MinVerifierKey bytes. At least one secret is required, because a verifier without
// keys would reject everything and almost certainly indicates a config bug.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("creating verifier: %w: no secrets given", ErrInvalidSecret)
	}
	keys := make([][]byte, 0, len(secrets))
	for i, secret := range secrets {
		key, err := ParseSecret(secret)
		if err != nil {
			return nil, fmt.Errorf("creating verifier: secret %d: %w", i, err)
		}
		if len(key) < MinVerifierKey {
			return nil, fmt.Errorf("creating verifier: secret %d: %w: a key of %d bytes, at least %d are needed",
				i, ErrInvalidSecret, len(key), MinVerifierKey)
		}
		keys = append(keys, key)
	}
	return &Verifier{keys: keys, Tolerance: DefaultTolerance}, nil
}

// Verify checks that body was sent by a holder of one of the accepted
// secrets, recently. Each failure class wraps a distinct sentinel error so
// callers can tell a misconfigured sender from a replay or a forgery.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	id := h.Get(HeaderID)
	rawTS := h.Get(HeaderTimestamp)
	sigs := h.Values(HeaderSignature)

	var missing []string
	if id == "" {
		missing = append(missing, HeaderID)
	}
	if rawTS == "" {
		missing = append(missing, HeaderTimestamp)
	}
	if len(sigs) == 0 || strings.TrimSpace(strings.Join(sigs, "")) == "" {
		missing = append(missing, HeaderSignature)
	}
	if len(missing) > 0 {
		return fmt.Errorf("reading headers: %w: %s", ErrMissingHeaders, strings.Join(missing, ", "))
	}

	unix, err := strconv.ParseInt(rawTS, 10, 64)
	if err != nil {
		return fmt.Errorf("parsing timestamp %q: %w", truncate(rawTS), ErrInvalidTimestamp)
	}
	if err := v.checkTimestamp(unix); err != nil {
		return err
	}

	expected := make([][]byte, len(v.keys))
	for i, key := range v.keys {
		expected[i] = mac(key, id, []byte(rawTS), body)
	}

	checked := 0
	for _, value := range sigs {
		for _, sig := range strings.Fields(value) {
			version, encoded, ok := strings.Cut(sig, ",")
			if !ok || version != signatureVersion {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(encoded)
			if err != nil {
				continue
			}
			checked++
			for _, want := range expected {
				if hmac.Equal(got, want) {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("verifying signature: %w (checked %d %s signature(s) against %d secret(s))",
		ErrNoMatchingSignature, checked, signatureVersion, len(v.keys))
}

// checkTimestamp rejects deliveries outside the tolerance window. It works
// in whole seconds on integers, the header's own resolution, so absurd
// timestamps (or clocks) cannot overflow arithmetic into the accepted window.
func (v *Verifier) checkTimestamp(unix int64) error {
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	tolerance := v.Tolerance
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	nowUnix := now().Unix()
	if absDiff(unix, nowUnix) > uint64(tolerance/time.Second) {
		return fmt.Errorf("checking timestamp: %w: got %d, now %d, tolerance %s",
			ErrTimestampOutOfTolerance, unix, nowUnix, tolerance)
	}
	return nil
}

// absDiff returns |a-b| exactly for any int64 pair: the true difference
// always fits in a uint64 and wrapping subtraction yields it.
func absDiff(a, b int64) uint64 {
	if a < b {
		a, b = b, a
	}
	return uint64(a) - uint64(b)
}

// truncate keeps attacker-controlled header values from bloating logs.
func truncate(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
