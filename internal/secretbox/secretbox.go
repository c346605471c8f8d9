// Package secretbox encrypts small secrets at rest (webhook signing secrets)
// with AES-256-GCM under a key ring: the first key encrypts, every key
// decrypts, so a key can be replaced without a moment when some rows cannot
// be read.
//
// A sealed value describes itself: "enc:v1:<key id>:<base64 of nonce and
// ciphertext>". Anything else is taken as stored in the clear, so rows
// written before a key was configured still read, and are sealed by the next
// re-encryption.
package secretbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// sealedPrefix starts every sealed value; v1 is AES-256-GCM with a 12-byte
// random nonce before the ciphertext.
const (
	sealedPrefix = "enc:"
	v1Prefix     = sealedPrefix + "v1:"
)

// KeySize is the length of a key in bytes: AES-256.
const KeySize = 32

var (
	// ErrUnknownKey is returned by Open for a value sealed under a key the
	// ring does not hold (or when there is no ring at all).
	ErrUnknownKey = errors.New("secretbox: sealed under a key that is not configured")
	// ErrDecrypt is returned by Open when the key is known but the value
	// does not open: the key's bytes changed under the same id, the value
	// was altered, or it was copied from another row (the associated data
	// differs).
	ErrDecrypt = errors.New("secretbox: value does not decrypt")
)

// Keyring holds the keys. A nil *Keyring is valid and stores in the clear:
// Seal returns its input, Open returns values stored in the clear and
// refuses sealed ones.
type Keyring struct {
	keys []key
}

type key struct {
	id   string
	aead cipher.AEAD
}

// Parse reads a key ring: comma-separated entries "<id>:<base64 of 32 bytes>",
// the first of which encrypts. An id is 1 to 32 letters, digits, '.', '_' or
// '-', unique in the ring. An empty string is no ring (nil, nil). Errors
// name an entry by position or id, never by its key material.
func Parse(s string) (*Keyring, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	k := &Keyring{}
	seen := map[string]bool{}
	for i, entry := range strings.Split(s, ",") {
		id, material, ok := strings.Cut(strings.TrimSpace(entry), ":")
		if !ok {
			return nil, fmt.Errorf("entry %d: want <id>:<base64 of %d bytes>", i+1, KeySize)
		}
		if !validID(id) {
			// Not quoted: an id and a key swapped would print the key.
			return nil, fmt.Errorf("entry %d: the key id (%d characters before the ':') must be 1 to 32 letters, digits, '.', '_' or '-'", i+1, len(id))
		}
		if seen[id] {
			return nil, fmt.Errorf("key %q: appears twice", id)
		}
		seen[id] = true
		raw, err := decodeKey(material)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", id, err)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", id, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", id, err)
		}
		k.keys = append(k.keys, key{id: id, aead: aead})
	}
	return k, nil
}

// decodeKey accepts what `openssl rand -base64 32` prints, padded or not.
func decodeKey(s string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		raw, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, errors.New("not standard base64")
	}
	if len(raw) != KeySize {
		return nil, fmt.Errorf("decodes to %d bytes, want %d (openssl rand -base64 %d)", len(raw), KeySize, KeySize)
	}
	return raw, nil
}

func validID(id string) bool {
	if id == "" || len(id) > 32 {
		return false
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Primary is the id of the key that encrypts; empty without a ring.
func (k *Keyring) Primary() string {
	if k == nil {
		return ""
	}
	return k.keys[0].id
}

// Seal encrypts plaintext under the primary key, bound to ad (the row's
// identity): the result opens only with the same ad. Without a ring it
// returns plaintext as is.
func (k *Keyring) Seal(plaintext string, ad []byte) (string, error) {
	if k == nil {
		return plaintext, nil
	}
	primary := k.keys[0]
	nonce := make([]byte, primary.aead.NonceSize(), primary.aead.NonceSize()+len(plaintext)+primary.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("reading a nonce: %w", err)
	}
	sealed := primary.aead.Seal(nonce, nonce, []byte(plaintext), ad)
	return v1Prefix + primary.id + ":" + base64.RawStdEncoding.EncodeToString(sealed), nil
}

// Open returns the plaintext of a stored value: a value stored in the clear
// as is, a sealed one decrypted with the key it names and checked against
// ad. A sealed value under a key the ring lacks is ErrUnknownKey, naming the
// key; one that does not open is ErrDecrypt.
func (k *Keyring) Open(stored string, ad []byte) (string, error) {
	if !strings.HasPrefix(stored, sealedPrefix) {
		return stored, nil
	}
	rest, ok := strings.CutPrefix(stored, v1Prefix)
	if !ok {
		version, _, _ := strings.Cut(strings.TrimPrefix(stored, sealedPrefix), ":")
		return "", fmt.Errorf("%w: unknown format version %q", ErrDecrypt, version)
	}
	id, data, ok := strings.Cut(rest, ":")
	if !ok {
		return "", fmt.Errorf("%w: malformed value (no key id)", ErrDecrypt)
	}
	if k == nil {
		return "", fmt.Errorf("%w: sealed under key %q, and no key is configured", ErrUnknownKey, id)
	}
	var aead cipher.AEAD
	for _, key := range k.keys {
		if key.id == id {
			aead = key.aead
		}
	}
	if aead == nil {
		return "", fmt.Errorf("%w: sealed under key %q, which is not among the configured keys %q", ErrUnknownKey, id, k.ids())
	}
	raw, err := base64.RawStdEncoding.DecodeString(data)
	if err != nil || len(raw) < aead.NonceSize()+aead.Overhead() {
		return "", fmt.Errorf("%w: malformed value under key %q", ErrDecrypt, id)
	}
	plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], ad)
	if err != nil {
		return "", fmt.Errorf("%w with key %q: a different key under that id, an altered value, or one copied from another row", ErrDecrypt, id)
	}
	return string(plain), nil
}

// Current reports whether stored is sealed under the primary key, so that
// re-encrypting it would change nothing. Without a ring nothing is current.
func (k *Keyring) Current(stored string) bool {
	return k != nil && strings.HasPrefix(stored, v1Prefix+k.keys[0].id+":")
}

func (k *Keyring) ids() []string {
	ids := make([]string, len(k.keys))
	for i, key := range k.keys {
		ids[i] = key.id
	}
	return ids
}
