// Package destination reads and checks where an endpoint's messages go: a
// webhook URL, or a broker destination written as a URL.
package destination

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
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

// ErrInvalid wraps every refusal of a destination's kind or name.
var ErrInvalid = errors.New("invalid destination")

// refusal is a destination refused: its Error for a log, its Reason for
// the person who named it (the admin API's problem detail).
type refusal struct{ reason string }

func refuse(format string, args ...any) error {
	return &refusal{reason: fmt.Sprintf(format, args...)}
}

func (e *refusal) Error() string        { return ErrInvalid.Error() + ": " + e.reason }
func (e *refusal) Reason() string       { return e.reason }
func (e *refusal) Is(target error) bool { return target == ErrInvalid }

// Spec is a destination as an API caller names it: a kind and,
// by kind, a URL, a subject, a topic, or an exchange and routing key.
type Spec struct {
	Kind       string `json:"kind,omitempty"`
	URL        string `json:"url,omitempty"`
	Subject    string `json:"subject,omitempty"`
	Topic      string `json:"topic,omitempty"`
	Exchange   string `json:"exchange,omitempty"`
	RoutingKey string `json:"routing_key,omitempty"`
}

// URLOf checks spec and writes it as the endpoint URL its kind stores. A
// webhook's URL is returned as given (the SSRF guard checks it separately).
func (spec Spec) URLOf() (string, error) {
	kind := spec.Kind
	if kind == "" {
		kind = KindWebhook
	}
	only := func(allowed ...string) error {
		fields := map[string]string{"url": spec.URL, "subject": spec.Subject, "topic": spec.Topic,
			"exchange": spec.Exchange, "routing_key": spec.RoutingKey}
		for name, v := range fields {
			if v != "" && !slices.Contains(allowed, name) {
				return refuse("%s does not apply to a %s destination (it takes %s)",
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
			return "", refuse("url is required")
		}
		if d, _ := Parse(spec.URL); d.Kind != KindWebhook {
			return "", refuse("%q is a %s destination: register it with kind %q", spec.URL, d.Kind, d.Kind)
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
		return "", refuse("unknown kind %q (want one of %s)", spec.Kind, strings.Join(Kinds, ", "))
	}
	if _, err := Parse(u); err != nil {
		return "", err
	}
	return u, nil
}

// Parse reads an endpoint URL and checks a broker destination's
// name by its broker's rules. Any URL that is not a broker destination is a
// webhook; its own checks (scheme, SSRF guard) are made where webhooks are
// registered and sent.
func Parse(rawURL string) (Destination, error) {
	d := destinationOf(rawURL)
	switch d.Kind {
	case KindNATS:
		return d, checkSubject(d.Name)
	case KindKafka:
		return d, checkTopic(d.Name)
	case KindRabbitMQ:
		if !strings.Contains(strings.TrimPrefix(rawURL, KindRabbitMQ+":"), "/") {
			return d, refuse("a RabbitMQ destination is exchange/routing-key, got %q", rawURL)
		}
		return d, checkExchange(d.Exchange, d.RoutingKey)
	}
	return d, nil
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
		return refuse("the NATS subject is empty")
	}
	if strings.HasPrefix(s, "$") || s == "_INBOX" || strings.HasPrefix(s, "_INBOX.") {
		return refuse("NATS subject %q is the server's own (%s): publish to a subject of your streams", s, controlSurface)
	}
	if len(s) > 255 {
		return refuse("the NATS subject is longer than 255 bytes")
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch {
		case tok == "":
			return refuse("NATS subject %q has an empty token", s)
		case tok == "*" || tok == ">":
			return refuse("NATS subject %q has a wildcard; publish to one subject", s)
		case strings.ContainsFunc(tok, unicode.IsSpace) || !utf8.ValidString(tok):
			return refuse("NATS subject %q has whitespace or invalid UTF-8", s)
		}
	}
	return nil
}

// Kafka's own rule for topic names.
var kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func checkTopic(s string) error {
	if !kafkaTopic.MatchString(s) || s == "." || s == ".." {
		return refuse("Kafka topic %q must be 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-' (and not . or ..)", s)
	}
	if strings.HasPrefix(s, "__") {
		return refuse("Kafka topic %q is internal to Kafka (%s): publish to a topic of your own", s, controlSurface)
	}
	return nil
}

// RabbitMQ's rule for exchange names; a routing key is any short string.
var amqpExchange = regexp.MustCompile(`^[a-zA-Z0-9._:-]{0,255}$`)

func checkExchange(ex, key string) error {
	if !amqpExchange.MatchString(ex) {
		return refuse("RabbitMQ exchange %q must be up to 255 of a-z, A-Z, 0-9, '.', '_', ':', '-'", ex)
	}
	if len(key) > 255 || !utf8.ValidString(key) {
		return refuse("the RabbitMQ routing key must be valid UTF-8 of at most 255 bytes")
	}
	if ex == "" && key == "" {
		return refuse("with the default exchange the routing key names the queue: it cannot be empty")
	}
	if strings.HasPrefix(ex, "amq.") && !amqpStandardExchanges[ex] {
		return refuse("RabbitMQ exchange %q is the server's own (%s): publish to one of your exchanges or amq.direct, amq.topic, amq.fanout, amq.headers, amq.match", ex, controlSurface)
	}
	if ex == "" && strings.HasPrefix(key, "amq.") {
		return refuse("RabbitMQ queue %q is a server-named or reply queue (%s): route to a queue of your own", key, controlSurface)
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
