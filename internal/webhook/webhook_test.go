package webhook_test

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/webhook"
)

// Reference vector from the Standard Webhooks test suite; matching it proves
// interoperability with receivers using other implementations.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

var vectorTime = time.Unix(vectorTimestamp, 0)

func fixedClock(t time.Time) func() time.Time {
	return func() time.Time { return t }
}

func newSecret(t *testing.T) string {
	t.Helper()
	secret, err := webhook.NewSecret()
	require.NoError(t, err)
	return secret
}

func newVerifier(t *testing.T, now time.Time, secrets ...string) *webhook.Verifier {
	t.Helper()
	v, err := webhook.NewVerifier(secrets...)
	require.NoError(t, err)
	v.Now = fixedClock(now)
	return v
}

func signedHeaders(t *testing.T, secret, id string, ts time.Time, body []byte) http.Header {
	t.Helper()
	s, err := webhook.NewSigner(secret)
	require.NoError(t, err)
	h := http.Header{}
	s.SetHeaders(h, id, ts, body)
	return h
}

func TestSignKnownAnswer(t *testing.T) {
	t.Parallel()

	key, err := webhook.ParseSecret(vectorSecret)
	require.NoError(t, err)
	require.Equal(t, vectorSignature, webhook.Sign(key, vectorID, vectorTime, []byte(vectorBody)))

	s, err := webhook.NewSigner(vectorSecret)
	require.NoError(t, err)
	require.Equal(t, vectorSignature, s.Sign(vectorID, vectorTime, []byte(vectorBody)))

	h := http.Header{}
	s.SetHeaders(h, vectorID, vectorTime, []byte(vectorBody))
	require.Equal(t, "application/json", h.Get("Content-Type"))
	require.Equal(t, vectorID, h.Get(webhook.HeaderID))
	require.Equal(t, "1614265330", h.Get(webhook.HeaderTimestamp))
	require.Equal(t, vectorSignature, h.Get(webhook.HeaderSignature))

	v := newVerifier(t, vectorTime, vectorSecret)
	require.NoError(t, v.Verify(h, []byte(vectorBody)))
}

func TestSignIgnoresSubSecondPrecision(t *testing.T) {
	t.Parallel()

	key, err := webhook.ParseSecret(vectorSecret)
	require.NoError(t, err)
	ts := vectorTime.Add(999 * time.Millisecond)
	require.Equal(t, vectorSignature, webhook.Sign(key, vectorID, ts, []byte(vectorBody)))
}

func TestNewSecret(t *testing.T) {
	t.Parallel()

	a := newSecret(t)
	b := newSecret(t)
	require.NotEqual(t, a, b)
	require.True(t, strings.HasPrefix(a, webhook.SecretPrefix))

	key, err := webhook.ParseSecret(a)
	require.NoError(t, err)
	require.Len(t, key, 32)
}

func TestParseSecret(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		secret  string
		wantKey []byte
		wantErr string
	}{
		{name: "valid", secret: "whsec_AQID", wantKey: []byte{1, 2, 3}},
		{name: "reference vector", secret: vectorSecret, wantKey: mustDecode(t, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")},
		{name: "empty", secret: "", wantErr: "missing"},
		{name: "no prefix", secret: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", wantErr: "missing"},
		{name: "wrong prefix case", secret: "WHSEC_AQID", wantErr: "missing"},
		{name: "prefix only", secret: "whsec_", wantErr: "empty key"},
		{name: "bad base64", secret: "whsec_not*base64", wantErr: "illegal base64"},
		{name: "url-safe alphabet", secret: "whsec_-_-_", wantErr: "illegal base64"},
		{name: "missing padding", secret: "whsec_AQI", wantErr: "illegal base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			key, err := webhook.ParseSecret(tt.secret)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, webhook.ErrInvalidSecret)
				require.ErrorContains(t, err, tt.wantErr)
				require.Nil(t, key)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantKey, key)
		})
	}
}

func TestNewSignerAndVerifierRejectBadSecrets(t *testing.T) {
	t.Parallel()

	_, err := webhook.NewSigner("nope")
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)

	_, err = webhook.NewVerifier()
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)

	_, err = webhook.NewVerifier(vectorSecret, "whsec_")
	require.ErrorIs(t, err, webhook.ErrInvalidSecret)
	require.ErrorContains(t, err, "secret 1")

	// A key anyone could guess by trying: 3 bytes, and 23.
	for _, short := range []string{"whsec_AAAA", "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, webhook.MinVerifierKey-1))} {
		_, err = webhook.NewVerifier(short)
		require.ErrorIs(t, err, webhook.ErrInvalidSecret, short)
		require.ErrorContains(t, err, "at least 24")
	}
	_, err = webhook.NewVerifier("whsec_" + base64.StdEncoding.EncodeToString(make([]byte, webhook.MinVerifierKey)))
	require.NoError(t, err)
}

func TestVerifyRoundTrip(t *testing.T) {
	t.Parallel()

	secret := newSecret(t)
	now := time.Now()
	bodies := [][]byte{nil, {}, []byte(`{"order_id":42}`), []byte("not json, still signed\n\x00\xff")}
	for _, body := range bodies {
		h := signedHeaders(t, secret, "msg_round_trip", now, body)
		require.NoError(t, newVerifier(t, now, secret).Verify(h, body))
	}
}

func TestVerifyDefaultsClockAndTolerance(t *testing.T) {
	t.Parallel()

	secret := newSecret(t)
	body := []byte(`{}`)
	v := &webhook.Verifier{}
	*v = *newVerifier(t, time.Time{}, secret)
	v.Now = nil
	v.Tolerance = 0

	require.NoError(t, v.Verify(signedHeaders(t, secret, "msg_1", time.Now(), body), body))

	stale := signedHeaders(t, secret, "msg_1", time.Now().Add(-webhook.DefaultTolerance-time.Minute), body)
	require.ErrorIs(t, v.Verify(stale, body), webhook.ErrTimestampOutOfTolerance)
}

func TestVerifyRotation(t *testing.T) {
	t.Parallel()

	oldSecret, newSecretValue, otherSecret := newSecret(t), newSecret(t), newSecret(t)
	oldKey, err := webhook.ParseSecret(oldSecret)
	require.NoError(t, err)
	newKey, err := webhook.ParseSecret(newSecretValue)
	require.NoError(t, err)
	otherKey, err := webhook.ParseSecret(otherSecret)
	require.NoError(t, err)

	const id = "msg_rotation"
	body := []byte(`{"rotating":true}`)
	sig := func(key []byte) string { return webhook.Sign(key, id, vectorTime, body) }

	tests := []struct {
		name      string
		signature string
		accepted  []string
		wantErr   error
	}{
		{name: "old signature, both accepted", signature: sig(oldKey), accepted: []string{oldSecret, newSecretValue}},
		{name: "new signature, both accepted", signature: sig(newKey), accepted: []string{oldSecret, newSecretValue}},
		{name: "both signatures, only new accepted", signature: sig(oldKey) + " " + sig(newKey), accepted: []string{newSecretValue}},
		{name: "both signatures, only old accepted", signature: sig(oldKey) + " " + sig(newKey), accepted: []string{oldSecret}},
		{name: "extra whitespace between signatures", signature: "  " + sig(otherKey) + "   " + sig(newKey) + " ", accepted: []string{newSecretValue}},
		{name: "unknown versions are skipped", signature: "v2,abc v1a,xyz " + sig(newKey), accepted: []string{newSecretValue}},
		{name: "malformed entries are skipped", signature: "garbage v1,@@@ v1, " + sig(newKey), accepted: []string{newSecretValue}},
		{name: "signed with a secret nobody accepts", signature: sig(otherKey), accepted: []string{oldSecret, newSecretValue}, wantErr: webhook.ErrNoMatchingSignature},
		{name: "only unknown versions", signature: "v2," + strings.TrimPrefix(sig(newKey), "v1,"), accepted: []string{newSecretValue}, wantErr: webhook.ErrNoMatchingSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			h := http.Header{}
			h.Set(webhook.HeaderID, id)
			h.Set(webhook.HeaderTimestamp, strconv.FormatInt(vectorTimestamp, 10))
			h.Set(webhook.HeaderSignature, tt.signature)

			err := newVerifier(t, vectorTime, tt.accepted...).Verify(h, body)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
}

func TestVerifySignatureHeaderRepeated(t *testing.T) {
	t.Parallel()

	secret := newSecret(t)
	body := []byte(`{}`)
	h := signedHeaders(t, secret, "msg_1", vectorTime, body)
	good := h.Get(webhook.HeaderSignature)
	h.Set(webhook.HeaderSignature, "v1,AAAA")
	h.Add(webhook.HeaderSignature, good)

	require.NoError(t, newVerifier(t, vectorTime, secret).Verify(h, body))
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()

	body := []byte(vectorBody)
	vectorHeaders := func() http.Header {
		h := http.Header{}
		h.Set(webhook.HeaderID, vectorID)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(vectorTimestamp, 10))
		h.Set(webhook.HeaderSignature, vectorSignature)
		return h
	}

	tests := []struct {
		name    string
		mutate  func(h http.Header) []byte
		now     time.Time
		wantErr error
		wantMsg string
	}{
		{
			name:    "tampered body",
			mutate:  func(http.Header) []byte { return []byte(`{"test": 2432232315}`) },
			wantErr: webhook.ErrNoMatchingSignature,
		},
		{
			name: "tampered id",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderID, vectorID+"x")
				return body
			},
			wantErr: webhook.ErrNoMatchingSignature,
		},
		{
			name: "tampered timestamp within tolerance",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, strconv.FormatInt(vectorTimestamp+1, 10))
				return body
			},
			wantErr: webhook.ErrNoMatchingSignature,
		},
		{
			name: "timestamp with leading zero is not the signed value",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, "0"+strconv.FormatInt(vectorTimestamp, 10))
				return body
			},
			wantErr: webhook.ErrNoMatchingSignature,
		},
		{
			name: "tampered signature",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderSignature, "v1,h0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
				return body
			},
			wantErr: webhook.ErrNoMatchingSignature,
		},
		{
			name: "truncated signature",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderSignature, "v1,g0hM9SsE")
				return body
			},
			wantErr: webhook.ErrNoMatchingSignature,
		},
		{
			name:    "stale",
			now:     vectorTime.Add(webhook.DefaultTolerance + time.Second),
			wantErr: webhook.ErrTimestampOutOfTolerance,
		},
		{
			name:    "future",
			now:     vectorTime.Add(-webhook.DefaultTolerance - time.Second),
			wantErr: webhook.ErrTimestampOutOfTolerance,
		},
		{
			name: "far future timestamp does not overflow",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, "9223372036854775807")
				return body
			},
			wantErr: webhook.ErrTimestampOutOfTolerance,
		},
		{
			name: "far past timestamp does not overflow",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, "-9223372036854775808")
				return body
			},
			wantErr: webhook.ErrTimestampOutOfTolerance,
		},
		{
			name: "non-numeric timestamp",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, "yesterday")
				return body
			},
			wantErr: webhook.ErrInvalidTimestamp,
		},
		{
			name: "fractional timestamp",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, "1614265330.5")
				return body
			},
			wantErr: webhook.ErrInvalidTimestamp,
		},
		{
			name: "timestamp overflowing int64",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderTimestamp, "99999999999999999999")
				return body
			},
			wantErr: webhook.ErrInvalidTimestamp,
		},
		{
			name: "missing id",
			mutate: func(h http.Header) []byte {
				h.Del(webhook.HeaderID)
				return body
			},
			wantErr: webhook.ErrMissingHeaders,
			wantMsg: webhook.HeaderID,
		},
		{
			name: "missing timestamp",
			mutate: func(h http.Header) []byte {
				h.Del(webhook.HeaderTimestamp)
				return body
			},
			wantErr: webhook.ErrMissingHeaders,
			wantMsg: webhook.HeaderTimestamp,
		},
		{
			name: "blank signature",
			mutate: func(h http.Header) []byte {
				h.Set(webhook.HeaderSignature, "   ")
				return body
			},
			wantErr: webhook.ErrMissingHeaders,
			wantMsg: webhook.HeaderSignature,
		},
		{
			name: "no headers at all",
			mutate: func(h http.Header) []byte {
				clear(h)
				return body
			},
			wantErr: webhook.ErrMissingHeaders,
			wantMsg: "webhook-id, webhook-timestamp, webhook-signature",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			h := vectorHeaders()
			got := body
			if tt.mutate != nil {
				got = tt.mutate(h)
			}
			now := tt.now
			if now.IsZero() {
				now = vectorTime
			}

			err := newVerifier(t, now, vectorSecret).Verify(h, got)
			require.ErrorIs(t, err, tt.wantErr)
			if tt.wantMsg != "" {
				require.ErrorContains(t, err, tt.wantMsg)
			}
		})
	}
}

func TestVerifyToleranceBoundary(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		offset  time.Duration
		wantErr error
	}{
		{name: "exactly tolerance old", offset: time.Minute},
		{name: "exactly tolerance ahead", offset: -time.Minute},
		{name: "one second past old", offset: time.Minute + time.Second, wantErr: webhook.ErrTimestampOutOfTolerance},
		{name: "one second past ahead", offset: -time.Minute - time.Second, wantErr: webhook.ErrTimestampOutOfTolerance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			v := newVerifier(t, vectorTime.Add(tt.offset), vectorSecret)
			v.Tolerance = time.Minute
			h := signedHeaders(t, vectorSecret, vectorID, vectorTime, []byte(vectorBody))

			err := v.Verify(h, []byte(vectorBody))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
}

func mustDecode(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	return b
}

func FuzzVerify(f *testing.F) {
	f.Add(vectorID, int64(vectorTimestamp), []byte(vectorBody), vectorSignature)
	f.Add("", int64(0), []byte{}, "")
	f.Add("msg_1", int64(-1), []byte("\x00\xff"), "v1, v1,, ,v1 v2,abc")
	f.Add("id.with.dots", int64(1<<62), []byte("body"), "v1,"+strings.Repeat("A", 44))
	f.Add("\r\n", int64(-1<<63), []byte(nil), "v1,!!!!")

	key, err := webhook.ParseSecret(vectorSecret)
	if err != nil {
		f.Fatal(err)
	}
	v, err := webhook.NewVerifier(vectorSecret)
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, id string, unix int64, body []byte, signature string) {
		ts := time.Unix(unix, 0)
		fixed := *v
		fixed.Now = fixedClock(ts)

		// Arbitrary input must be rejected or accepted, never panic.
		h := http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(unix, 10))
		h.Set(webhook.HeaderSignature, signature)
		_ = fixed.Verify(h, body)

		h = http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, signature)
		h.Set(webhook.HeaderSignature, signature)
		_ = fixed.Verify(h, body)

		// Anything we sign must verify, whatever the id and body contain.
		if id == "" {
			return
		}
		h = http.Header{}
		h.Set(webhook.HeaderID, id)
		h.Set(webhook.HeaderTimestamp, strconv.FormatInt(unix, 10))
		h.Set(webhook.HeaderSignature, webhook.Sign(key, id, ts, body))
		require.NoError(t, fixed.Verify(h, body))
	})
}
