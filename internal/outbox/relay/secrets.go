package relay

import (
	"fmt"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// Endpoint signing secrets (webhook_endpoints.secret and previous_secret)
// are sealed with the key ring when one is configured, each bound to its
// endpoint's id, so a database dump or a replica does not let its reader
// sign webhooks. The admin seals them at creation and rotation; the relay
// opens them when it signs. Without a ring they are stored in the clear.

// signing is what a delivery is signed with: the endpoint's secrets opened,
// or why they could not be.
type signing struct {
	secret, previous string
	err              error
}

// signing opens the endpoint secrets a claim returned. Each is opened once
// per session: every row of a claim carries the same values, and they change
// only with a rotation. A secret that cannot be opened (sealed under a key
// this relay lacks) is never replaced by anything else: the delivery fails
// with the reason and is retried on the schedule, so nothing goes out
// unsigned or signed with the wrong key.
func (s *session) signing(row outboxdb.MessageClaimRow) signing {
	secret, err := s.open(row.EndpointSecret)
	if err != nil {
		return signing{err: fmt.Errorf("not sent: the endpoint's signing secret cannot be decrypted: %w", err)}
	}
	previous, err := s.open(row.EndpointPreviousSecret)
	if err != nil {
		return signing{err: fmt.Errorf("not sent: the endpoint's previous signing secret cannot be decrypted: %w", err)}
	}
	return signing{secret: secret, previous: previous}
}

func (s *session) open(stored string) (string, error) {
	if stored == "" {
		return "", nil
	}
	if plain, ok := s.opened[stored]; ok {
		return plain, nil
	}
	plain, err := s.r.cfg.SecretKeys.Open(stored, s.dest[:])
	if err != nil {
		return "", err
	}
	if s.opened == nil {
		s.opened = map[string]string{}
	}
	s.opened[stored] = plain
	return plain, nil
}
