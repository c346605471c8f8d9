package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Destination kinds. An endpoint is a webhook URL or a broker destination;
// each kind is written as a URL (the endpoint's url column), so one table,
// one claim and one history serve them all:
//
//	webhook   https://example.com/hook
//	nats      nats:orders.events            (a JetStream subject)
//	kafka     kafka:orders                  (a topic)
//	rabbitmq  rabbitmq:orders/order.placed  (exchange "/" routing key)
//
// The broker's address and credentials are never part of it: they come from
// the worker's configuration, so an API caller cannot point the relay at a
// server of their choosing. Nor at the broker's own control surface: a
// destination names a place for events, never an API the relay's
// credentials could drive (controlSurface).
const (
	KindWebhook  = "webhook"
	KindNATS     = "nats"
	KindKafka    = "kafka"
	KindRabbitMQ = "rabbitmq"
)

// Kinds lists the destination kinds, webhook first.
var Kinds = []string{KindWebhook, KindNATS, KindKafka, KindRabbitMQ}

// Destination is where an endpoint's messages go, parsed from its URL.
type Destination struct {
	Kind string
	// URL is the webhook URL, or the broker destination written as a URL.
	URL string
	// Name is the JetStream subject or the Kafka topic.
	Name string
	// Exchange and RoutingKey address a RabbitMQ publish; the empty exchange
	// is RabbitMQ's default one, which routes to the queue named by the key.
	Exchange   string
	RoutingKey string
}

// ErrInvalidDestination wraps every refusal of a destination's kind or name.
var ErrInvalidDestination = errors.New("invalid destination")

// DestinationSpec is a destination as an API caller names it: a kind and,
// by kind, a URL, a subject, a topic, or an exchange and routing key.
type DestinationSpec struct {
	Kind       string `json:"kind,omitempty"`
	URL        string `json:"url,omitempty"`
	Subject    string `json:"subject,omitempty"`
	Topic      string `json:"topic,omitempty"`
	Exchange   string `json:"exchange,omitempty"`
	RoutingKey string `json:"routing_key,omitempty"`
}

// URLOf checks spec and writes it as the endpoint URL its kind stores. A
// webhook's URL is returned as given (the SSRF guard checks it separately).
func (spec DestinationSpec) URLOf() (string, error) {
	kind := spec.Kind
	if kind == "" {
		kind = KindWebhook
	}
	only := func(allowed ...string) error {
		fields := map[string]string{"url": spec.URL, "subject": spec.Subject, "topic": spec.Topic,
			"exchange": spec.Exchange, "routing_key": spec.RoutingKey}
		for name, v := range fields {
			if v != "" && !contains(allowed, name) {
				return invalid(ErrInvalidDestination, "%s does not apply to a %s destination (it takes %s)",
					name, kind, strings.Join(allowed, " and "))
			}
		}
		return nil
	}
	var u string
	switch kind {
	case KindWebhook:
		if err := only("url"); err != nil {
			return "", err
		}
		if spec.URL == "" {
			return "", invalid(ErrInvalidDestination, "url is required")
		}
		if d, _ := parseDestination(spec.URL); d.Kind != KindWebhook {
			return "", invalid(ErrInvalidDestination, "%q is a %s destination: register it with kind %q", spec.URL, d.Kind, d.Kind)
		}
		return spec.URL, nil
	case KindNATS:
		if err := only("subject"); err != nil {
			return "", err
		}
		u = KindNATS + ":" + spec.Subject
	case KindKafka:
		if err := only("topic"); err != nil {
			return "", err
		}
		u = KindKafka + ":" + spec.Topic
	case KindRabbitMQ:
		if err := only("exchange", "routing_key"); err != nil {
			return "", err
		}
		u = KindRabbitMQ + ":" + spec.Exchange + "/" + spec.RoutingKey
	default:
		return "", invalid(ErrInvalidDestination, "unknown kind %q (want one of %s)", spec.Kind, strings.Join(Kinds, ", "))
	}
	if _, err := parseDestination(u); err != nil {
		return "", err
	}
	return u, nil
}

// parseDestination reads an endpoint URL and checks a broker destination's
// name by its broker's rules. Any URL that is not a broker destination is a
// webhook; its own checks (scheme, SSRF guard) are made where webhooks are
// registered and sent.
func parseDestination(rawURL string) (Destination, error) {
	d := destinationOf(rawURL)
	switch d.Kind {
	case KindNATS:
		return d, checkSubject(d.Name)
	case KindKafka:
		return d, checkTopic(d.Name)
	case KindRabbitMQ:
		if !strings.Contains(strings.TrimPrefix(rawURL, KindRabbitMQ+":"), "/") {
			return d, invalid(ErrInvalidDestination, "a RabbitMQ destination is exchange/routing-key, got %q", rawURL)
		}
		return d, checkExchange(d.Exchange, d.RoutingKey)
	}
	return d, nil
}

// Target is where d goes: its Destination, or, when that was not set, its
// URL read.
func (d Delivery) Target() Destination {
	if d.Destination.Kind != "" {
		return d.Destination
	}
	return destinationOf(d.URL)
}

// destinationOf splits an endpoint URL into its kind and names without
// checking them: what the relay does for every delivery, of URLs that were
// checked when they were stored.
func destinationOf(rawURL string) Destination {
	scheme, rest, _ := strings.Cut(rawURL, ":")
	d := Destination{Kind: scheme, URL: rawURL}
	switch scheme {
	case KindNATS, KindKafka:
		d.Name = rest
	case KindRabbitMQ:
		d.Exchange, d.RoutingKey, _ = strings.Cut(rest, "/")
	default:
		d.Kind = KindWebhook
	}
	return d
}

// checkSubject accepts a JetStream subject a message can be published to:
// dot-separated tokens, none empty, no wildcards, no whitespace, and none
// of the server's own (controlSurface).
func checkSubject(s string) error {
	if s == "" {
		return invalid(ErrInvalidDestination, "the NATS subject is empty")
	}
	if strings.HasPrefix(s, "$") || s == "_INBOX" || strings.HasPrefix(s, "_INBOX.") {
		return invalid(ErrInvalidDestination, "NATS subject %q is the server's own (%s): publish to a subject of your streams", s, controlSurface)
	}
	if len(s) > 255 {
		return invalid(ErrInvalidDestination, "the NATS subject is longer than 255 bytes")
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch {
		case tok == "":
			return invalid(ErrInvalidDestination, "NATS subject %q has an empty token", s)
		case tok == "*" || tok == ">":
			return invalid(ErrInvalidDestination, "NATS subject %q has a wildcard; publish to one subject", s)
		case strings.ContainsFunc(tok, unicode.IsSpace) || !utf8.ValidString(tok):
			return invalid(ErrInvalidDestination, "NATS subject %q has whitespace or invalid UTF-8", s)
		}
	}
	return nil
}

// Kafka's own rule for topic names.
var kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func checkTopic(s string) error {
	if !kafkaTopic.MatchString(s) || s == "." || s == ".." {
		return invalid(ErrInvalidDestination, "Kafka topic %q must be 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-' (and not . or ..)", s)
	}
	if strings.HasPrefix(s, "__") {
		return invalid(ErrInvalidDestination, "Kafka topic %q is internal to Kafka (%s): publish to a topic of your own", s, controlSurface)
	}
	return nil
}

// RabbitMQ's rule for exchange names; a routing key is any short string.
var amqpExchange = regexp.MustCompile(`^[a-zA-Z0-9._:-]{0,255}$`)

func checkExchange(ex, key string) error {
	if !amqpExchange.MatchString(ex) {
		return invalid(ErrInvalidDestination, "RabbitMQ exchange %q must be up to 255 of a-z, A-Z, 0-9, '.', '_', ':', '-'", ex)
	}
	if len(key) > 255 || !utf8.ValidString(key) {
		return invalid(ErrInvalidDestination, "the RabbitMQ routing key must be valid UTF-8 of at most 255 bytes")
	}
	if ex == "" && key == "" {
		return invalid(ErrInvalidDestination, "with the default exchange the routing key names the queue: it cannot be empty")
	}
	if strings.HasPrefix(ex, "amq.") && !amqpStandardExchanges[ex] {
		return invalid(ErrInvalidDestination, "RabbitMQ exchange %q is the server's own (%s): publish to one of your exchanges or amq.direct, amq.topic, amq.fanout, amq.headers, amq.match", ex, controlSurface)
	}
	if ex == "" && strings.HasPrefix(key, "amq.") {
		return invalid(ErrInvalidDestination, "RabbitMQ queue %q is a server-named or reply queue (%s): route to a queue of your own", key, controlSurface)
	}
	return nil
}

// controlSurface is why a broker's own names are refused: publishing to
// them drives the broker rather than storing an event (a NATS subject under
// $JS.API purges or deletes streams, one under _INBOX answers another
// client's request), with the relay's credentials and on an API caller's
// word. The destination is checked when it is stored and again before each
// delivery, so a row stored before this rule is not delivered either.
const controlSurface = "a control surface, not a place for events"

// amqpStandardExchanges are the exchanges every RabbitMQ server declares
// for its users: the other amq. ones are the server's own (its event,
// log and trace exchanges).
var amqpStandardExchanges = map[string]bool{
	"amq.direct": true, "amq.topic": true, "amq.fanout": true, "amq.headers": true, "amq.match": true,
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// Router is the relay's Transport when destinations are of several kinds:
// it sends each delivery with the transport of its destination's kind. A
// kind with no transport (no broker configured on this worker) fails the
// attempt with an error that says so, and the destination backs off alone.
type Router map[string]Transport

// Deliver implements Transport.
func (r Router) Deliver(ctx context.Context, d Delivery) Result {
	d.Destination = d.Target()
	t := r[d.Destination.Kind]
	if t == nil {
		return Result{Err: fmt.Errorf("no %s connection is configured on this worker", d.Destination.Kind)}
	}
	return t.Deliver(ctx, d)
}

func orEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
