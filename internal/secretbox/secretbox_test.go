package secretbox_test

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/secretbox"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// newKey returns a fresh key as the environment spells it, and its base64.
func newKey(t *testing.T, id string) (entry, material string) {
	t.Helper()
	raw := make([]byte, secretbox.KeySize)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	material = base64.StdEncoding.EncodeToString(raw)
	return id + ":" + material, material
}

func ring(t *testing.T, entries ...string) *secretbox.Keyring {
	t.Helper()
	k, err := secretbox.Parse(strings.Join(entries, ","))
	require.NoError(t, err)
	require.NotNil(t, k)
	return k
}

func TestSealOpensWithTheSameAssociatedDataOnly(t *testing.T) {
	t.Parallel()
	k1, material := newKey(t, "k1")
	k := ring(t, k1)
	row := []byte("endpoint-a")

	sealed, err := k.Seal(secret, row)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(sealed, "enc:v1:k1:"), "a sealed value names its format and key: %s", sealed)
	require.NotContains(t, sealed, secret, "the plaintext is not in the sealed value")
	require.NotContains(t, sealed, strings.TrimPrefix(secret, "whsec_"), "nor its base64 part")
	require.NotContains(t, sealed, material, "nor the key")
	again, err := k.Seal(secret, row)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "each seal has its own nonce")

	got, err := k.Open(sealed, row)
	require.NoError(t, err)
	require.Equal(t, secret, got, "a sealed value opens to its plaintext")

	_, err = k.Open(sealed, []byte("endpoint-b"))
	require.ErrorIs(t, err, secretbox.ErrDecrypt, "a value copied to another row does not open")

	tampered := sealed[:len(sealed)-2] + "AA"
	if tampered == sealed {
		tampered = sealed[:len(sealed)-2] + "BB"
	}
	_, err = k.Open(tampered, row)
	require.ErrorIs(t, err, secretbox.ErrDecrypt, "an altered value does not open")

	otherBytes, _ := newKey(t, "k1")
	_, err = ring(t, otherBytes).Open(sealed, row)
	require.ErrorIs(t, err, secretbox.ErrDecrypt, "other key bytes under the same id do not open it")
	require.Contains(t, err.Error(), `"k1"`, "the error names the key")

	_, err = k.Open("enc:v9:k1:AAAA", row)
	require.ErrorIs(t, err, secretbox.ErrDecrypt, "an unknown format version is refused, not taken as plaintext")
	_, err = k.Open("enc:v1:k1:!!!", row)
	require.ErrorIs(t, err, secretbox.ErrDecrypt, "malformed base64 is refused")
}

func TestPlaintextStillReads(t *testing.T) {
	t.Parallel()
	k1, _ := newKey(t, "k1")
	got, err := ring(t, k1).Open(secret, []byte("row"))
	require.NoError(t, err)
	require.Equal(t, secret, got, "a value stored before a key was configured reads as is")
	require.False(t, ring(t, k1).Current(secret), "a value in the clear is not current: re-encryption seals it")
}

func TestNoRingStoresInTheClear(t *testing.T) {
	t.Parallel()
	k, err := secretbox.Parse("  ")
	require.NoError(t, err)
	require.Nil(t, k, "an empty setting is no key ring")
	sealed, err := k.Seal(secret, []byte("row"))
	require.NoError(t, err)
	require.Equal(t, secret, sealed, "without a ring, Seal stores in the clear")
	got, err := k.Open(secret, []byte("row"))
	require.NoError(t, err)
	require.Equal(t, secret, got)
	require.Empty(t, k.Primary())

	k1, _ := newKey(t, "k1")
	sealed, err = ring(t, k1).Seal(secret, []byte("row"))
	require.NoError(t, err)
	_, err = k.Open(sealed, []byte("row"))
	require.ErrorIs(t, err, secretbox.ErrUnknownKey, "a sealed value without a ring is an error, never returned as a secret")
	require.Contains(t, err.Error(), `"k1"`, "the error names the missing key")
}

func TestRotation(t *testing.T) {
	t.Parallel()
	oldEntry, _ := newKey(t, "2024")
	newEntry, _ := newKey(t, "2025")
	row := []byte("row")
	before, err := ring(t, oldEntry).Seal(secret, row)
	require.NoError(t, err)

	rotated := ring(t, newEntry, oldEntry)
	require.Equal(t, "2025", rotated.Primary(), "the first key encrypts")
	got, err := rotated.Open(before, row)
	require.NoError(t, err)
	require.Equal(t, secret, got, "an older key still decrypts")
	require.False(t, rotated.Current(before), "a value under the older key is due for re-encryption")

	after, err := rotated.Seal(got, row)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(after, "enc:v1:2025:"), "new values are sealed under the first key")
	require.True(t, rotated.Current(after))

	newOnly := ring(t, newEntry)
	got, err = newOnly.Open(after, row)
	require.NoError(t, err)
	require.Equal(t, secret, got, "once re-encrypted, the old key can go")
	_, err = newOnly.Open(before, row)
	require.ErrorIs(t, err, secretbox.ErrUnknownKey, "a value still under a removed key is an error")
	require.Contains(t, err.Error(), `"2024"`, "naming the key it needs")
}

func TestParseErrorsNeverShowKeyMaterial(t *testing.T) {
	t.Parallel()
	good, material := newKey(t, "a")
	short := base64.StdEncoding.EncodeToString(make([]byte, 16))
	for name, tc := range map[string]struct{ in, want string }{
		"no id":              {material, "entry 1"},
		"bad id":             {"a b:" + material, "key id"},
		"key and id swapped": {material + ":k1", "entry 1: the key id (44 characters"},
		"duplicate id":       {good + "," + good, `key "a": appears twice`},
		"not base64":         {"b:" + material + "!", `key "b": not standard base64`},
		"short key":          {"b:" + short, `key "b": decodes to 16 bytes, want 32`},
		"empty entry":        {good + ",", "entry 2"},
		"colon in data":      {"b::" + material, `key "b"`},
	} {
		_, err := secretbox.Parse(tc.in)
		require.Error(t, err, name)
		require.Contains(t, err.Error(), tc.want, name)
		require.NotContains(t, err.Error(), material, "%s: the error does not repeat the key", name)
		require.NotContains(t, err.Error(), short, "%s: the error does not repeat the key", name)
	}
	unpadded := "c:" + strings.TrimRight(material, "=")
	k, err := secretbox.Parse(" " + unpadded + " , " + good)
	require.NoError(t, err, "unpadded base64 and spaces around entries are accepted")
	require.Equal(t, "c", k.Primary())
}
