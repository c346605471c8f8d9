// Package admin is the outbox as its operators see it: endpoints (create,
// change, pause, delete, rotate secrets, replay), messages (list, retry,
// skip) and the read models behind the admin API and the ops page. Every
// read is bounded by a window or a partial index, so none grows with the
// delivered history kept for the retention.
package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/destination"
	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
	"github.com/outboxkit/orders/internal/secretbox"
	"github.com/outboxkit/orders/internal/webhook"
)

var (
	// ErrNotFound is returned when an endpoint or message does not exist.
	ErrNotFound = errors.New("outbox: not found")

	// ErrConflict is returned when a transition does not apply to a row's
	// current status, such as retrying a message that has not failed.
	ErrConflict = errors.New("outbox: conflicting state")
)

// ErrInvalidEndpoint is returned for an endpoint registration that cannot be
// accepted: a bad or forbidden URL, or no event types.
var ErrInvalidEndpoint = errors.New("outbox: invalid webhook endpoint")

// ErrIdempotencyConflict is returned, beside ErrConflict, when a request
// repeats an earlier one's Idempotency-Key (or creation id) but asks for
// something else: another destination or other event types, another
// overlap.
var ErrIdempotencyConflict = errors.New("outbox: idempotency key already used with a different request")

// URLChecker vets a webhook URL before it is stored (the SSRF guard).
type URLChecker interface {
	CheckURL(ctx context.Context, rawURL string) error
}

// Endpoint is a registered destination: a webhook receiver, or a broker
// destination written as a URL (see destination.Kinds). Its secret is shown once, when
// it is created, and never listed afterwards.
type Endpoint struct {
	ID uuid.UUID `json:"id"`
	// Kind is destination.KindWebhook or a broker's kind, read from URL.
	Kind           string    `json:"kind"`
	URL            string    `json:"url"`
	EventTypes     []string  `json:"event_types"`
	Enabled        bool      `json:"enabled"`
	DisabledReason string    `json:"disabled_reason,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	Secret         string    `json:"secret,omitempty"`
	// State is outbox.HealthHealthy, outbox.HealthBackingOff or outbox.HealthPaused; StateSince
	// when it began (unknown for an endpoint healthy since its creation),
	// StateReason why (the failure that made it back off, or why it was
	// paused).
	State       string     `json:"state"`
	StateSince  *time.Time `json:"state_since,omitempty"`
	StateReason string     `json:"state_reason,omitempty"`
	// ConsecutiveFailures counts its endpoint-wide failures in a row.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// NextProbeAt, while backing off, is when one message will try it again.
	NextProbeAt *time.Time `json:"next_probe_at,omitempty"`
	// ThrottledUntil, while healthy, is the end of a wait the receiver asked
	// for with Retry-After.
	ThrottledUntil *time.Time `json:"throttled_until,omitempty"`
	// DeliveryState is what it is doing now, finer than State: one of
	// DeliveryDelivering, DeliveryRetrying, DeliveryCircuitOpen and
	// DeliveryPaused. NextAttemptAt is when one of its messages is next
	// tried (past while some are due now); nil while it is paused or when no
	// message waits to be tried.
	DeliveryState string     `json:"delivery_state,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	// PreviousSecretExpiresAt, once the secret was rotated, is when the
	// previous secret stops (or stopped) signing beside the current one.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at,omitempty"`
}

// Message is one delivery of an event to one endpoint (an outbox_messages
// row), as the admin surface shows it.
type Message struct {
	// ID is the delivery's own id; EventID the event's, which is what the
	// receiver sees as webhook-id (the same for every endpoint).
	ID          uuid.UUID `json:"id"`
	EventID     uuid.UUID `json:"event_id"`
	Type        string    `json:"type"`
	Destination uuid.UUID `json:"destination"`
	Status      string    `json:"status"`
	Attempts    int       `json:"attempts"`
	// NextAttemptAt is when a pending message is due (for a settled one,
	// when it last was); nil while it is parked.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// OrderingKey is its event's ordering key, if any. Parked: it is pending
	// behind an earlier message of the same key and endpoint, and is due
	// when that one is delivered or skipped.
	OrderingKey string     `json:"ordering_key,omitempty"`
	Parked      bool       `json:"parked,omitempty"`
	ClaimedAt   *time.Time `json:"claimed_at,omitempty"`
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	DiscardedAt *time.Time `json:"discarded_at,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	// CreatedAt is when this delivery was written: its event's time, or
	// later for a replay. EventCreatedAt is the event's.
	CreatedAt      time.Time       `json:"created_at"`
	EventCreatedAt time.Time       `json:"event_created_at"`
	Payload        json.RawMessage `json:"payload"`
}

// Body is the webhook body the relay sends for the message:
// {"id","type","created_at","data"}: the event's id and time, data being
// the payload as stored.
func (m Message) Body() []byte { return webhook.Body(m.EventID, m.Type, m.EventCreatedAt, m.Payload) }

// Stats are the outbox's counts by status and its oldest pending age.
type Stats struct {
	Pending   int64 `json:"pending"`
	Claimed   int64 `json:"claimed"`
	Delivered int64 `json:"delivered"`
	Failed    int64 `json:"failed"`
	Discarded int64 `json:"discarded"`
	// Parked counts the pending messages that wait for an earlier message
	// of their ordering key (included in Pending).
	Parked                  int64   `json:"parked"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

// Service is what operators do to the outbox: manage endpoints, look at the
// backlog, requeue failed messages.
type Service struct {
	pool    *pgxpool.Pool
	checker URLChecker
	logger  *slog.Logger
	// keys seal the signing secrets it writes; nil stores them in the clear.
	keys *secretbox.Keyring
	// stallThreshold judges RelayStatus; 0 means DefaultStallThreshold.
	stallThreshold time.Duration
	// arrivals keeps the overview's counts of minutes that are over, lags
	// their delivery lags over every endpoint.
	arrivals minuteCache[int64]
	lags     minuteCache[[]latencyBucket]
	// catalog is the event types subscriptions may name; nil names any.
	catalog *outbox.Catalog
}

// New returns the admin service; checker vets endpoint URLs.
func New(pool *pgxpool.Pool, checker URLChecker, logger *slog.Logger, opts ...Option) *Service {
	a := &Service{pool: pool, checker: checker, logger: logger}
	for _, o := range opts {
		o(a)
	}
	return a
}

// CreateEndpoint registers a destination for eventTypes and returns it with its
// newly generated signing secret.
func (a *Service) CreateEndpoint(ctx context.Context, rawURL string, eventTypes []string) (Endpoint, error) {
	return a.CreateEndpointOnce(ctx, uuid.New(), rawURL, eventTypes)
}

// CreateEndpointOnce is CreateEndpoint under an id the caller chose, for a
// request that may come twice (a form submitted with a double click, a
// client retrying after its answer was lost). A second call with the id
// creates nothing and returns the endpoint the first one made, with its
// secret, so that whoever sees only the second answer can still verify
// its webhooks; if it asks for another URL or other event types
// (ErrIdempotencyConflict too), if the endpoint was changed since (its
// secret rotated, say), or if it comes more than createdOnceFor after the
// first, it is ErrConflict.
func (a *Service) CreateEndpointOnce(ctx context.Context, id uuid.UUID, rawURL string, eventTypes []string) (Endpoint, error) {
	ep, _, err := a.createEndpoint(ctx, id, rawURL, eventTypes)
	return ep, err
}

// CreateEndpointWithKey is CreateEndpointOnce for a request carrying an
// Idempotency-Key, as POST /orders takes one: the key names the endpoint
// (its id is derived from it), so the request sent again with the key gets
// the first one's endpoint and secret, and replayed says so. A key is at
// most maxIdempotencyKeyBytes of text.
func (a *Service) CreateEndpointWithKey(ctx context.Context, key, rawURL string, eventTypes []string) (ep Endpoint, replayed bool, err error) {
	if err := checkIdempotencyKey(key); err != nil {
		return Endpoint{}, false, err
	}
	return a.createEndpoint(ctx, uuid.NewSHA1(keyedEndpoints, []byte(key)), rawURL, eventTypes)
}

// keyedEndpoints is the name space of the ids CreateEndpointWithKey
// derives from Idempotency-Keys.
var keyedEndpoints = uuid.MustParse("4f2f3c1e-6a43-4d55-9b1c-0e0c6d3a7e21")

// maxIdempotencyKeyBytes bounds an Idempotency-Key, as the orders API does.
const maxIdempotencyKeyBytes = 255

// checkIdempotencyKey refuses a key that is too long or not text.
func checkIdempotencyKey(key string) error {
	if len(key) > maxIdempotencyKeyBytes || !isText(key) {
		return invalid(ErrInvalidEndpoint, "Idempotency-Key must be UTF-8 text of at most %d bytes", maxIdempotencyKeyBytes)
	}
	return nil
}

// createEndpoint is CreateEndpointOnce, saying whether it answered a
// repeat.
func (a *Service) createEndpoint(ctx context.Context, id uuid.UUID, rawURL string, eventTypes []string) (Endpoint, bool, error) {
	types, err := a.subscription(eventTypes)
	if err != nil {
		return Endpoint{}, false, err
	}
	if err := a.checkDestination(ctx, rawURL); err != nil {
		return Endpoint{}, false, err
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		return Endpoint{}, false, fmt.Errorf("generating secret: %w", err)
	}
	stored, err := a.sealSecret(id, secret)
	if err != nil {
		return Endpoint{}, false, err
	}
	row, err := outboxdb.New(a.pool).EndpointInsert(ctx, outboxdb.EndpointInsertParams{
		ID: id, Url: rawURL, Secret: stored, EventTypes: types})
	if errors.Is(err, pgx.ErrNoRows) {
		ep, err := a.createdBefore(ctx, id, rawURL, types)
		return ep, err == nil, err
	}
	if err != nil {
		return Endpoint{}, false, fmt.Errorf("inserting endpoint: %w", err)
	}
	a.logger.InfoContext(ctx, "webhook endpoint created", slog.String("endpoint_id", row.ID.String()),
		slog.String("url", row.Url), slog.Any("event_types", row.EventTypes))
	ep := a.described(ctx, toEndpoint(row))
	ep.Secret = secret
	return ep, false, nil
}

// createdOnceFor is how long after a creation its repeat is answered with
// the endpoint and its secret: long enough for a retry or a double click,
// short enough that an id learnt later shows no secret.
const createdOnceFor = 10 * time.Minute

// createdBefore is the endpoint an earlier CreateEndpointOnce made under
// id, with its secret, if it was asked for the same URL and event types
// and nothing changed it since: every change (a rotation, a new URL, a
// pause) moves updated_at off created_at, and that stays when
// reencrypt-secrets drops a rotation's ended overlap, the other sign of a
// rotation. A form submitted twice gets its endpoint; one submitted again
// after a rotation never shows the new secret.
func (a *Service) createdBefore(ctx context.Context, id uuid.UUID, rawURL string, types []string) (Endpoint, error) {
	row, err := outboxdb.New(a.pool).EndpointGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, fmt.Errorf("creating endpoint: %w: endpoint %s was created and deleted since", ErrConflict, id)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("reading endpoint: %w", err)
	}
	if row.Url != rawURL || !slices.Equal(row.EventTypes, types) {
		return Endpoint{}, fmt.Errorf("creating endpoint: %w: %w: endpoint %s was created for another destination or other event types",
			ErrConflict, ErrIdempotencyConflict, id)
	}
	if !row.UpdatedAt.Equal(row.CreatedAt) || time.Since(row.CreatedAt) > createdOnceFor {
		return Endpoint{}, fmt.Errorf("creating endpoint: %w: endpoint %s exists, changed since (its secret rotated?) or created over %s ago: its secret is not shown again",
			ErrConflict, id, createdOnceFor)
	}
	secret, err := a.keys.Open(row.Secret, id[:])
	if err != nil {
		return Endpoint{}, fmt.Errorf("decrypting endpoint %s's secret: %w", id, err)
	}
	ep := a.described(ctx, toEndpoint(row))
	ep.Secret = secret
	return ep, nil
}

// EndpointChange is a change to an endpoint: nil fields stay as they are.
type EndpointChange struct {
	URL        *string
	EventTypes []string
}

// UpdateEndpoint changes an endpoint's URL or event types in place, keeping
// its id, secret, pause and messages: what is already waiting is sent to the
// new URL, and the new types apply to events written from now on. A new URL
// starts healthy, and is tried at once: the old destination's circuit and
// backoff said nothing of it.
func (a *Service) UpdateEndpoint(ctx context.Context, id uuid.UUID, c EndpointChange) (Endpoint, error) {
	types, err := a.checkChange(ctx, c)
	if err != nil {
		return Endpoint{}, err
	}
	var row outboxdb.WebhookEndpoint
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		before, err := q.EndpointGet(ctx, id)
		if err != nil {
			return err
		}
		if c.URL != nil && *c.URL != before.Url {
			// Messages before the endpoint, as everywhere else.
			if _, err := q.MessageProbeNow(ctx, id); err != nil {
				return fmt.Errorf("making a message due for the new destination: %w", err)
			}
		}
		row, err = q.EndpointUpdate(ctx, c.URL, types, id)
		return err
	})
	if err != nil {
		return Endpoint{}, notFound("updating endpoint", err)
	}
	a.logger.InfoContext(ctx, "webhook endpoint changed", slog.String("endpoint_id", id.String()),
		slog.String("url", row.Url), slog.Any("event_types", row.EventTypes))
	return a.described(ctx, toEndpoint(row)), nil
}

// CheckEndpointChange vets a change as UpdateEndpoint would, without
// making it (an ErrInvalidEndpoint error saying why), so a form can refuse
// it before asking for a confirmation.
func (a *Service) CheckEndpointChange(ctx context.Context, c EndpointChange) error {
	_, err := a.checkChange(ctx, c)
	return err
}

// checkChange vets a change and returns its event types sorted and
// deduplicated (nil when it does not change them).
func (a *Service) checkChange(ctx context.Context, c EndpointChange) ([]string, error) {
	if c.URL == nil && c.EventTypes == nil {
		return nil, invalid(ErrInvalidEndpoint, "a change names a destination (url, or kind and its fields), event_types, or both")
	}
	var types []string
	if c.EventTypes != nil {
		var err error
		if types, err = a.subscription(c.EventTypes); err != nil {
			return nil, err
		}
	}
	if c.URL != nil {
		if err := a.checkDestination(ctx, *c.URL); err != nil {
			return nil, err
		}
	}
	return types, nil
}

// checkDestination vets an endpoint URL: a broker destination's name by
// its broker's rules, a webhook URL by the checker (the SSRF guard). A
// broker destination names no server, so there is nothing for the guard to
// check: the brokers are the worker's configuration.
func (a *Service) checkDestination(ctx context.Context, rawURL string) error {
	if !isText(rawURL) {
		// PostgreSQL stores neither: a NUL in a subject or routing key, or
		// bytes that are not UTF-8 in a URL's path, would fail the write.
		return invalid(ErrInvalidEndpoint, "a destination must be UTF-8 text without NUL")
	}
	if len(rawURL) > maxDestinationBytes {
		return invalid(ErrInvalidEndpoint, "a destination is at most %d bytes", maxDestinationBytes)
	}
	d, err := destination.Parse(rawURL)
	if err != nil {
		return invalidAs(ErrInvalidEndpoint, "", err)
	}
	if d.Kind != destination.KindWebhook {
		return nil
	}
	if err := a.checker.CheckURL(ctx, rawURL); err != nil {
		return invalidAs(ErrInvalidEndpoint, "url", err)
	}
	return nil
}

// subscription sorts and deduplicates a subscription's types, and refuses an
// empty one, and one naming a type the catalog lacks.
func (a *Service) subscription(in []string) ([]string, error) {
	types := slices.Compact(slices.Sorted(slices.Values(in)))
	if len(types) == 0 {
		return nil, invalid(ErrInvalidEndpoint, "event_types must name at least one event type")
	}
	if len(types) > maxEventTypes {
		return nil, invalid(ErrInvalidEndpoint, "event_types names %d types; at most %d", len(types), maxEventTypes)
	}
	for _, t := range types {
		if strings.TrimSpace(t) == "" {
			return nil, invalid(ErrInvalidEndpoint, "event_types must not contain an empty type")
		}
		if !isText(t) {
			return nil, invalid(ErrInvalidEndpoint, "event_types must be UTF-8 text without NUL bytes")
		}
		if strings.TrimSpace(t) != t {
			// No event's type has spaces around it: such a type matches none.
			return nil, invalid(ErrInvalidEndpoint, "event type %q has spaces around it", t)
		}
		if len(t) > maxEventTypeBytes {
			return nil, invalid(ErrInvalidEndpoint, "an event type is at most %d bytes", maxEventTypeBytes)
		}
		if !a.known(t) {
			// A typo subscribed to nothing, silently, and for good.
			return nil, invalid(ErrInvalidEndpoint, "event type %q is not in the event catalog; the known types are %s (GET /event-types)",
				t, strings.Join(a.catalog.Names(), ", "))
		}
	}
	return types, nil
}

// Bounds of an endpoint's registration. Beyond them PostgreSQL refuses the
// row (a type too long for webhook_endpoints_event_types_idx's entries, which
// answered 500), and no real destination or subscription comes near them.
const (
	maxEventTypes       = 100
	maxEventTypeBytes   = 255
	maxDestinationBytes = 2048
)

// isText reports whether s is text PostgreSQL takes: valid UTF-8 without NUL
// bytes. Anything else makes the statement fail, which a caller would see
// as the server's error rather than its own.
func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// Endpoints lists every endpoint, without secrets, with its delivery state.
func (a *Service) Endpoints(ctx context.Context) ([]Endpoint, error) {
	q := outboxdb.New(a.pool)
	rows, err := q.EndpointList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	eps := make([]Endpoint, len(rows))
	ptrs := make([]*Endpoint, len(rows))
	for i, r := range rows {
		eps[i] = toEndpoint(r)
		ptrs[i] = &eps[i]
	}
	if err := withDelivery(ctx, q, ptrs...); err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	return eps, nil
}

// Endpoint returns one endpoint, without its secret, with its delivery
// state.
func (a *Service) Endpoint(ctx context.Context, id uuid.UUID) (Endpoint, error) {
	q := outboxdb.New(a.pool)
	row, err := q.EndpointGet(ctx, id)
	if err != nil {
		return Endpoint{}, notFound("getting endpoint", err)
	}
	ep := toEndpoint(row)
	if err := withDelivery(ctx, q, &ep); err != nil {
		return Endpoint{}, fmt.Errorf("getting endpoint: %w", err)
	}
	return ep, nil
}

// described is a changed endpoint with its delivery state, for the
// change's answer. The change has committed, so a failed read leaves the
// two out (and is logged) rather than failing a change that was made: a
// rotation's answer is the only one to show its new secret.
func (a *Service) described(ctx context.Context, ep Endpoint) Endpoint {
	if err := withDelivery(ctx, outboxdb.New(a.pool), &ep); err != nil {
		a.logger.WarnContext(ctx, "reading a changed endpoint's delivery state", slog.String("endpoint_id", ep.ID.String()),
			slog.Any("error", err))
	}
	return ep
}

// Delivery states: what an endpoint is doing now, as the API's
// delivery_state and the ops page name it. They refine State: a healthy
// endpoint whose every waiting message is waiting out its own retry (a
// receiver answering 422 to everything, which never opens the circuit) is
// retrying, not delivering.
const (
	// DeliveryDelivering: enabled, circuit closed, and what waits for it is
	// due now, or nothing waits.
	DeliveryDelivering = "delivering"
	// DeliveryRetrying: enabled, circuit closed, and nothing that waits is
	// due: its messages wait out their retries (or a Retry-After) until
	// NextAttemptAt.
	DeliveryRetrying = "retrying"
	// DeliveryCircuitOpen: backing off as a whole (State outbox.HealthBackingOff);
	// one message probes it at NextAttemptAt.
	DeliveryCircuitOpen = "circuit_open"
	// DeliveryPaused: disabled (State outbox.HealthPaused); nothing is tried.
	DeliveryPaused = "paused"
)

// withDelivery fills in the endpoints' DeliveryState and NextAttemptAt
// from their next attempts (EndpointNextAttempts), judged by the
// database's clock, and from the State and Enabled they were read with.
func withDelivery(ctx context.Context, q *outboxdb.Queries, eps ...*Endpoint) error {
	ids := make([]uuid.UUID, len(eps))
	for i, ep := range eps {
		ids[i] = ep.ID
	}
	rows, err := q.EndpointNextAttempts(ctx, ids)
	if err != nil {
		return fmt.Errorf("reading next attempts: %w", err)
	}
	next := make(map[uuid.UUID]outboxdb.EndpointNextAttemptsRow, len(rows))
	for _, r := range rows {
		next[r.ID] = r
	}
	for _, ep := range eps {
		r, waits := next[ep.ID]
		ep.NextAttemptAt = nil
		if waits && ep.Enabled {
			ep.NextAttemptAt = &r.NextAttemptAt
		}
		switch {
		case !ep.Enabled:
			ep.DeliveryState = DeliveryPaused
		case ep.State == outbox.HealthBackingOff:
			ep.DeliveryState = DeliveryCircuitOpen
		case waits && r.NextAttemptAt.After(r.Now):
			ep.DeliveryState = DeliveryRetrying
		default:
			ep.DeliveryState = DeliveryDelivering
		}
	}
	return nil
}

// Discarding a message is a write of its row, tens of thousands a second:
// an endpoint deleted after a day of outage can have millions waiting, which
// neither one transaction nor the request that deletes it should wait for.
// A deletion discards in batches of discardBatch (the first in its own
// transaction), for at most discardInlineFor, and leaves the rest to the
// relay's orphan job (MessagesDiscardOrphans, every orphanInterval).
const (
	discardBatch     = 10_000
	discardInlineFor = 5 * time.Second
)

// DeleteEndpoint removes an endpoint and stops its deliveries for good: in
// the same transaction its messages not yet delivered (claimed, failed,
// pending) start being settled as discarded, with the reason, never to be
// sent or retried, and they go on being settled in batches after it. A
// message a deliver job is recording at that moment is left to the job,
// and what it leaves pending to the relay's orphan job. It
// returns how many it discarded: all of them, unless there were more than
// it could settle in discardInlineFor (then the log says so, and the
// relay's orphan job discards the rest, starting within orphanInterval).
// Delivered history is kept for its retention.
func (a *Service) DeleteEndpoint(ctx context.Context, id uuid.UUID) (int64, error) {
	const reason = "endpoint deleted"
	var discarded, n int64
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		// The destination's lock, then the endpoint's row: the deletion
		// waits for a claim or a recording in progress, then discards
		// without waiting for any message (SKIP LOCKED), so it never
		// closes a cycle of waits, and no claim after it finds the
		// endpoint (relay/order.go).
		if err := q.DestinationLock(ctx, id); err != nil {
			return fmt.Errorf("locking destination: %w", err)
		}
		if _, err := q.EndpointLockForDelete(ctx, id); err != nil {
			return notFound("deleting endpoint", err)
		}
		var err error
		n, err = q.MessagesDiscardForDestination(ctx, reason, id, discardBatch)
		if err != nil {
			return fmt.Errorf("discarding the endpoint's messages: %w", err)
		}
		if _, err := q.EndpointDelete(ctx, id); err != nil {
			return fmt.Errorf("deleting endpoint: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	discarded = n
	q := outboxdb.New(a.pool)
	// Until a batch finds nothing: one can come back short and yet not be
	// the last, when the relay recorded one of its messages delivered while
	// it waited (it re-reads the row and keeps it).
	for stop := time.Now().Add(discardInlineFor); n > 0 && time.Now().Before(stop); discarded += n {
		if n, err = q.MessagesDiscardForDestination(ctx, reason, id, discardBatch); err != nil {
			// The endpoint is deleted; the relay discards the rest.
			a.logger.WarnContext(ctx, "discarding a deleted endpoint's messages", slog.String("endpoint_id", id.String()),
				slog.Any("error", err))
			break
		}
	}
	attrs := []any{slog.String("endpoint_id", id.String()), slog.Int64("discarded", discarded)}
	if n > 0 || err != nil {
		attrs = append(attrs, slog.Bool("rest_left_to_relay", true))
	}
	a.logger.InfoContext(ctx, "webhook endpoint deleted; its undelivered messages were discarded", attrs...)
	return discarded, nil
}

// SetEndpointEnabled pauses (disables) or resumes (enables) an endpoint by
// hand. A paused endpoint's messages are kept and wait; resuming delivers
// them, and resuming an endpoint that is backing off probes it at once.
func (a *Service) SetEndpointEnabled(ctx context.Context, id uuid.UUID, enabled bool) (Endpoint, error) {
	reason := "disabled by an operator"
	var row outboxdb.WebhookEndpoint
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) (err error) {
		q := outboxdb.New(tx)
		if enabled {
			if _, err := q.MessageProbeNow(ctx, id); err != nil {
				return fmt.Errorf("making a message due for the probe: %w", err)
			}
		}
		if row, err = q.EndpointSetEnabled(ctx, enabled, &reason, id); err != nil {
			return notFound("updating endpoint", err)
		}
		return nil
	})
	if err != nil {
		return Endpoint{}, err
	}
	a.logger.InfoContext(ctx, "webhook endpoint updated", slog.String("endpoint_id", id.String()), slog.Bool("enabled", enabled))
	return a.described(ctx, toEndpoint(row)), nil
}

// RotateSecret gives an endpoint a new signing secret and returns it. For
// overlap the relay signs with both the new and the previous secret, so the
// receiver can switch at its own pace without rejecting a delivery.
//
// The relay signs with two secrets at most, so while an earlier rotation's
// overlap runs another is refused with ErrConflict, saying until when:
// it would drop the previous secret while receivers may still use it, and
// it is nearly always a retry whose answer was lost or a second operator.
// A rotation with overlap 0 is never refused: it ends every earlier secret
// at once, for a secret that leaked.
func (a *Service) RotateSecret(ctx context.Context, id uuid.UUID, overlap time.Duration) (Endpoint, error) {
	ep, _, err := a.rotateSecret(ctx, id, overlap, "", nil)
	return ep, err
}

// RotateSecretWithKey is RotateSecret for a request carrying an
// Idempotency-Key: the request sent again with the key, while its rotation
// is the endpoint's last, gets that rotation and its secret (replayed),
// within rotatedOnceFor of it; later, ErrConflict. With another overlap
// it is ErrIdempotencyConflict.
func (a *Service) RotateSecretWithKey(ctx context.Context, id uuid.UUID, overlap time.Duration, key string) (ep Endpoint, replayed bool, err error) {
	if err := checkIdempotencyKey(key); err != nil {
		return Endpoint{}, false, err
	}
	return a.rotateSecret(ctx, id, overlap, key, nil)
}

// RotateSecretAsSeen is RotateSecret for a person who confirmed it looking
// at seen: it rotates only if nobody rotated the secret since seen was read,
// and otherwise returns ErrConflict and changes nothing. A confirmation
// submitted twice (a double click, a reload of the page that showed the new
// secret) rotates once, instead of replacing the shown secret unseen and
// ending the overlap of the one the receiver still uses.
func (a *Service) RotateSecretAsSeen(ctx context.Context, seen Endpoint, overlap time.Duration) (Endpoint, error) {
	ep, _, err := a.rotateSecret(ctx, seen.ID, overlap, "", &seen)
	return ep, err
}

// rotatedOnceFor is how long after a rotation the request sent again with
// its Idempotency-Key is answered with its secret, as createdOnceFor is a
// creation's.
const rotatedOnceFor = createdOnceFor

func (a *Service) rotateSecret(ctx context.Context, id uuid.UUID, overlap time.Duration, key string, seen *Endpoint) (Endpoint, bool, error) {
	if overlap < 0 || overlap > 30*24*time.Hour {
		return Endpoint{}, false, invalid(ErrInvalidEndpoint, "overlap must be from 0 to 720h, got %s", overlap)
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		return Endpoint{}, false, fmt.Errorf("generating secret: %w", err)
	}
	stored, err := a.sealSecret(id, secret)
	if err != nil {
		return Endpoint{}, false, err
	}
	p := outboxdb.EndpointRotateSecretParams{OverlapSeconds: overlap.Seconds(), Secret: stored, ID: id}
	if key != "" {
		p.IdempotencyKey = &key
	}
	if seen != nil {
		p.Guarded, p.SeenPreviousExpiresAt = true, seen.PreviousSecretExpiresAt
	}
	var row outboxdb.WebhookEndpoint
	var replayed bool
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		var err error
		row, err = q.EndpointRotateSecret(ctx, p)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		last, err := q.EndpointRotation(ctx, outboxdb.EndpointRotationParams{IdempotencyKey: p.IdempotencyKey,
			OverlapSeconds: p.OverlapSeconds, ShownForSeconds: rotatedOnceFor.Seconds(), ID: id})
		if err != nil {
			return err
		}
		row = last.WebhookEndpoint
		switch rotated := row.SecretRotatedAt; {
		case last.SameKey && !last.SameOverlap:
			return fmt.Errorf("%w: %w: the Idempotency-Key's rotation was made with another overlap", ErrConflict, ErrIdempotencyConflict)
		case last.SameKey && !last.Recent:
			return fmt.Errorf("%w: the Idempotency-Key's rotation was made over %s ago, at %s: its secret is not shown again",
				ErrConflict, rotatedOnceFor, rotated.UTC().Format(time.RFC3339))
		case last.SameKey:
			replayed = true
			secret, err = a.keys.Open(row.Secret, id[:])
			if err != nil {
				return fmt.Errorf("decrypting endpoint %s's secret: %w", id, err)
			}
			return nil
		case seen != nil && !equalTimes(seen.PreviousSecretExpiresAt, row.PreviousSecretExpiresAt):
			return fmt.Errorf("%w: it was rotated since it was read", ErrConflict)
		case last.Overlapping:
			return fmt.Errorf("%w: its previous secret signs until %s, and a rotation now would drop it while receivers may "+
				"still use it: rotate after that, or with overlap 0s to end every earlier secret at once",
				ErrConflict, row.PreviousSecretExpiresAt.UTC().Format(time.RFC3339))
		}
		return fmt.Errorf("%w: the endpoint's last rotation changed while this one was refused: try again", ErrConflict)
	})
	if err != nil {
		return Endpoint{}, false, notFound("rotating endpoint secret", err)
	}
	if !replayed {
		a.logger.InfoContext(ctx, "webhook endpoint secret rotated", slog.String("endpoint_id", id.String()),
			slog.Duration("overlap", overlap))
	}
	ep := a.described(ctx, toEndpoint(row))
	ep.Secret = secret
	return ep, replayed, nil
}

// equalTimes reports whether two optional times are both absent or equal.
func equalTimes(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// Stats counts messages by status.
func (a *Service) Stats(ctx context.Context) (Stats, error) {
	s, err := outboxdb.New(a.pool).MessageStats(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("reading outbox stats: %w", err)
	}
	return Stats{Pending: s.Pending, Claimed: s.Claimed, Delivered: s.Delivered, Failed: s.Failed,
		Discarded: s.Discarded, Parked: s.Parked, OldestPendingAgeSeconds: s.OldestPendingAgeSeconds}, nil
}

// ErrInvalidStatus is returned for a status filter that is not a status.
var ErrInvalidStatus = errors.New("outbox: invalid status filter")

// ErrInvalidFilter is returned by Messages for a filter value that cannot
// name anything stored (not text).
var ErrInvalidFilter = errors.New("outbox: invalid message filter")

// Attempt is one delivery attempt of a message.
type Attempt struct {
	Attempt    int       `json:"attempt"`
	Outcome    string    `json:"outcome"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	DurationMS float64   `json:"duration_ms"`
	StatusCode int       `json:"status_code,omitempty"`
	Error      string    `json:"error,omitempty"`
}

// MessageDetail is a message with its whole attempt history and, for one
// with an ordering key, where it stands in its key.
type MessageDetail struct {
	Message
	History []Attempt `json:"attempt_history"`
	// HeldBy, for a parked message, is the earlier message of its key it
	// waits for (nil if none is left: it is about to be promoted).
	HeldBy *KeyHead `json:"held_by,omitempty"`
	// Holding, for an unfinished keyed message, counts the later messages
	// of its key parked behind it.
	Holding int64 `json:"holding,omitempty"`
}

// KeyHead is the message at the head of an ordering key.
type KeyHead struct {
	ID     uuid.UUID `json:"id"`
	Status string    `json:"status"`
}

// MessageFilter selects messages for Messages. Zero fields match anything.
type MessageFilter struct {
	Status      string
	Type        string
	Destination *uuid.UUID
	// Event selects the deliveries of one event.
	Event *uuid.UUID
	// OrderingKey selects the deliveries of the events of one ordering key
	// (the orders module's events are keyed by order id), read on the
	// key's index: all of them, whatever their time, unless CreatedFrom
	// and CreatedTo say otherwise.
	OrderingKey string
	// CreatedFrom (inclusive) and CreatedTo (exclusive) bound the time the
	// messages' events were written (event_created_at), the order Messages
	// lists them in: the window is a range of the primary key, and only
	// the window is read. A replayed copy is in its event's window.
	CreatedFrom, CreatedTo *time.Time
	// Before is the pagination cursor: only messages older than this id.
	Before *uuid.UUID
	// After is the cursor of the page before (newer): the Limit messages
	// just newer than this id, still listed newest first. Before is ignored
	// with it.
	After *uuid.UUID
	// Limit bounds the page; 0 means 50.
	Limit int
}

// Messages lists messages newest first and returns the cursor of the next
// (older) page: nil on the last page, even one that ends exactly at Limit,
// as one row more than the page tells.
func (a *Service) Messages(ctx context.Context, f MessageFilter) ([]Message, *uuid.UUID, error) {
	from, to := idTimeMin, idTimeMax
	if f.CreatedFrom != nil {
		from = *f.CreatedFrom
	}
	if f.CreatedTo != nil {
		to = *f.CreatedTo
	}
	from, to = idTimes(from, to)
	limit := cmp.Or(f.Limit, 50)
	read := limit + 1 // whether an older page exists
	if f.After != nil {
		// The page just newer than After: the older page is After's.
		read = limit
	}
	p := outboxdb.MessageListParams{Destination: f.Destination, EventID: f.Event, EventsFrom: from, EventsTo: to,
		BeforeID: f.Before, MaxRows: int32(read)}
	if f.Status != "" {
		if !slices.Contains(outbox.Statuses, f.Status) {
			return nil, nil, invalid(ErrInvalidStatus, "status must be one of %s, not %q", strings.Join(outbox.Statuses, ", "), f.Status)
		}
		p.Status = &f.Status
	}
	if !isText(f.Type) || !isText(f.OrderingKey) {
		return nil, nil, invalid(ErrInvalidFilter, "type and ordering_key must be UTF-8 text without NUL bytes")
	}
	if f.Type != "" {
		p.Type = &f.Type
	}
	var rows []outboxdb.MessageListRow
	var err error
	switch {
	case f.After != nil:
		rows, err = a.messagesNewer(ctx, f.OrderingKey, *f.After, p)
	case f.OrderingKey != "":
		rows, err = a.messagesByKey(ctx, f.OrderingKey, p)
	default:
		rows, err = outboxdb.New(a.pool).MessageList(ctx, p)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("listing messages: %w", err)
	}
	msgs := make([]Message, len(rows))
	for i, r := range rows {
		msgs[i] = toMessage(r)
	}
	var next *uuid.UUID
	switch {
	case f.After != nil && len(msgs) > 0:
		next = &msgs[len(msgs)-1].ID
	case len(msgs) > limit:
		msgs = msgs[:limit]
		next = &msgs[limit-1].ID
	}
	return msgs, next, nil
}

// messagesByKey is MessageList for one ordering key, within a window of
// event time (MessageFilter.OrderingKey).
func (a *Service) messagesByKey(ctx context.Context, key string, p outboxdb.MessageListParams) ([]outboxdb.MessageListRow, error) {
	rows, err := outboxdb.New(a.pool).MessageListByKey(ctx, outboxdb.MessageListByKeyParams{OrderingKey: &key,
		EventsFrom: p.EventsFrom, EventsTo: p.EventsTo, EventID: p.EventID, Status: p.Status, Type: p.Type, Destination: p.Destination,
		BeforeID: p.BeforeID, MaxRows: p.MaxRows})
	if err != nil {
		return nil, err
	}
	out := make([]outboxdb.MessageListRow, len(rows))
	for i, r := range rows {
		out[i] = outboxdb.MessageListRow(r)
	}
	return out, nil
}

// messagesNewer is the page just newer than after (MessageFilter.After),
// newest first like every page.
func (a *Service) messagesNewer(ctx context.Context, key string, after uuid.UUID, p outboxdb.MessageListParams) ([]outboxdb.MessageListRow, error) {
	var out []outboxdb.MessageListRow
	q := outboxdb.New(a.pool)
	if key != "" {
		rows, err := q.MessageListByKeyNewer(ctx, outboxdb.MessageListByKeyNewerParams{OrderingKey: &key,
			EventsFrom: p.EventsFrom, EventsTo: p.EventsTo, EventID: p.EventID, Status: p.Status, Type: p.Type, Destination: p.Destination,
			AfterID: after, MaxRows: p.MaxRows})
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			out = append(out, outboxdb.MessageListRow(r))
		}
	} else {
		rows, err := q.MessageListNewer(ctx, outboxdb.MessageListNewerParams{Status: p.Status, Type: p.Type, Destination: p.Destination,
			EventID: p.EventID, EventsFrom: p.EventsFrom, EventsTo: p.EventsTo, AfterID: after, MaxRows: p.MaxRows})
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			out = append(out, outboxdb.MessageListRow(r))
		}
	}
	slices.Reverse(out)
	return out, nil
}

// EventRecorded reports whether the outbox holds an event with this id
// (within the retention), whether or not any endpoint was subscribed.
func (a *Service) EventRecorded(ctx context.Context, id uuid.UUID) (bool, error) {
	ok, err := outboxdb.New(a.pool).EventExists(ctx, id)
	if err != nil {
		return false, fmt.Errorf("looking up event: %w", err)
	}
	return ok, nil
}

// Message returns one message with its attempt history.
func (a *Service) Message(ctx context.Context, id uuid.UUID) (MessageDetail, error) {
	q := outboxdb.New(a.pool)
	row, err := q.MessageGet(ctx, id)
	if err != nil {
		return MessageDetail{}, notFound("getting message", err)
	}
	attempts, err := q.AttemptsList(ctx, id)
	if err != nil {
		return MessageDetail{}, fmt.Errorf("listing attempts: %w", err)
	}
	d := MessageDetail{Message: toMessage(outboxdb.MessageListRow(row)), History: make([]Attempt, len(attempts))}
	if row.OrderingKey != nil && d.Status != outbox.StatusDelivered && d.Status != outbox.StatusDiscarded {
		key := *row.OrderingKey
		if d.Parked {
			head, err := q.MessageKeyHead(ctx, row.Destination, key, id)
			switch {
			case err == nil:
				d.HeldBy = &KeyHead{ID: head.ID, Status: head.Status}
			case !errors.Is(err, pgx.ErrNoRows):
				return MessageDetail{}, fmt.Errorf("finding the head of the message's key: %w", err)
			}
		}
		if d.Holding, err = q.MessagesParkedBehind(ctx, row.Destination, key, id); err != nil {
			return MessageDetail{}, fmt.Errorf("counting the messages parked behind: %w", err)
		}
	}
	for i, at := range attempts {
		d.History[i] = toAttempt(at.Attempt, at.Outcome, at.StartedAt, at.FinishedAt, at.StatusCode, at.Error)
	}
	return d, nil
}

// Retry requeues a failed message (failed → pending) with a fresh attempt
// budget. Retrying a message that has not failed, or whose endpoint was
// deleted, is ErrConflict. A retried message with an ordering key still
// goes first: the messages of its key parked behind it wait for it.
func (a *Service) Retry(ctx context.Context, id uuid.UUID) (Message, error) {
	var msg Message
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		_, err := q.MessageRetry(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			m, err := q.MessageGet(ctx, id)
			if err != nil {
				return notFound("getting message", err)
			}
			if m.Status == outbox.StatusFailed {
				return fmt.Errorf("retrying message: %w: its endpoint was deleted", ErrConflict)
			}
			return fmt.Errorf("retrying message: %w: it is %s; only failed messages can be retried", ErrConflict, m.Status)
		}
		if err != nil {
			return fmt.Errorf("retrying message: %w", err)
		}
		row, err := q.MessageGet(ctx, id)
		if err != nil {
			return fmt.Errorf("getting message: %w", err)
		}
		msg = toMessage(outboxdb.MessageListRow(row))
		return nil
	})
	if err != nil {
		return Message{}, err
	}
	a.logger.InfoContext(ctx, "failed message requeued", slog.String("message_id", id.String()))
	return msg, nil
}

// Skip gives up on a failed message: it is settled as discarded and never
// sent, and the next message of its ordering key, which waited behind it,
// is due at once. Skipping a message that has not failed is ErrConflict.
func (a *Service) Skip(ctx context.Context, id uuid.UUID) (Message, error) {
	var msg Message
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := outboxdb.New(tx)
		m, err := q.MessageGet(ctx, id)
		if err != nil {
			return notFound("getting message", err)
		}
		// The destination's lock before the skip, as every change to
		// per-key order takes it (relay/order.go): the promotion below sees
		// any message a claim parked behind this one.
		if err := q.DestinationLock(ctx, m.Destination); err != nil {
			return fmt.Errorf("locking destination: %w", err)
		}
		skipped, err := q.MessageSkip(ctx, "skipped by an operator", id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("skipping message: %w: it is %s; only failed messages can be skipped", ErrConflict, m.Status)
		}
		if err != nil {
			return fmt.Errorf("skipping message: %w", err)
		}
		if skipped.OrderingKey != nil {
			if _, err := q.MessagesPromote(ctx, []string{*skipped.OrderingKey}, skipped.Destination); err != nil {
				return fmt.Errorf("promoting the next message of its key: %w", err)
			}
		}
		row, err := q.MessageGet(ctx, id)
		if err != nil {
			return fmt.Errorf("getting message: %w", err)
		}
		msg = toMessage(outboxdb.MessageListRow(row))
		return nil
	})
	if err != nil {
		return Message{}, err
	}
	a.logger.InfoContext(ctx, "failed message skipped", slog.String("message_id", id.String()))
	return msg, nil
}

func toAttempt(n int32, outcome string, started, finished time.Time, status *int32, errText *string) Attempt {
	at := Attempt{Attempt: int(n), Outcome: outcome, StartedAt: started, FinishedAt: finished,
		DurationMS: float64(finished.Sub(started).Microseconds()) / 1000}
	if status != nil {
		at.StatusCode = int(*status)
	}
	if errText != nil {
		at.Error = *errText
	}
	return at
}

func notFound(action string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", action, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", action, err)
}

func toEndpoint(r outboxdb.WebhookEndpoint) Endpoint {
	d, _ := destination.Parse(r.Url)
	ep := Endpoint{ID: r.ID, Kind: d.Kind, URL: r.Url, EventTypes: r.EventTypes, Enabled: r.Enabled, CreatedAt: r.CreatedAt,
		State: r.Health, StateSince: r.HealthChangedAt, ConsecutiveFailures: int(r.ConsecutiveFailures),
		PreviousSecretExpiresAt: r.PreviousSecretExpiresAt}
	if r.HealthReason != nil {
		ep.StateReason = *r.HealthReason
	}
	switch {
	case !r.Enabled:
		ep.State, ep.StateSince, ep.StateReason = outbox.HealthPaused, r.DisabledAt, ""
		if ep.StateSince == nil {
			// Paused by a hand in the table: its last update is the best there is.
			ep.StateSince = &r.UpdatedAt
		}
		if r.DisabledReason != nil {
			ep.DisabledReason = *r.DisabledReason
			ep.StateReason = *r.DisabledReason
		}
	case r.Health == outbox.HealthBackingOff:
		ep.NextProbeAt = r.BackoffUntil
	case r.BackoffUntil != nil && r.BackoffUntil.After(time.Now()):
		ep.ThrottledUntil = r.BackoffUntil
	}
	return ep
}

func toMessage(r outboxdb.MessageListRow) Message {
	m := Message{ID: r.ID, EventID: r.EventID, Type: r.Type, Destination: r.Destination, Status: r.Status,
		Attempts: int(r.Attempts), Parked: r.Parked, ClaimedAt: r.ClaimedAt, DeliveredAt: r.DeliveredAt,
		DiscardedAt: r.DiscardedAt, CreatedAt: r.CreatedAt, EventCreatedAt: r.EventCreatedAt, Payload: r.Payload}
	if !r.Parked {
		m.NextAttemptAt = &r.NextAttemptAt
	}
	if r.OrderingKey != nil {
		m.OrderingKey = *r.OrderingKey
	}
	if r.LastError != nil {
		m.LastError = *r.LastError
	}
	return m
}
