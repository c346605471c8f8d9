// Package consumer is the reference webhook receiver: what "consumers must be
// idempotent" means in code, written to be copied into the service that
// receives this service's webhooks.
//
// Delivery is at-least-once: the relay can die between sending a webhook and
// recording that it did, and then it sends it again with the same
// webhook-id, which is the event id: the same for every endpoint the event
// is sent to, so a consumer listening on two endpoints (or moving from one
// URL to another) applies it once too. A consumer therefore
//
//  1. verifies the Standard Webhooks signature (constant time, several
//     secrets for rotation, a timestamp tolerance against replays) before it
//     trusts a byte of the body, and
//  2. checks the event's data against the schema its sender publishes for
//     its type (the webhooks of the OpenAPI description, openapi.yaml:
//     a receiver elsewhere keeps a copy of it, or generates types from
//     it), so an event it cannot read is refused as the sender's defect
//     and not half applied; unknown fields pass, since a sender may add
//     fields without a new version;
//  3. applies each event exactly once: it inserts the webhook-id into an
//     inbox table with a unique key in the SAME transaction as the event's
//     effect (here a per-customer order ledger and balance). A redelivery
//     finds the id, changes nothing, and is acknowledged with a 2xx so the
//     sender stops retrying. The id is remembered for as long as the sender
//     may send it again (PruneInbox forgets it after that), not forever.
//
// The consumer is a separate service: it owns its schema and applies its own
// goose migrations, with a version table of its own, so it can share a
// database with nothing or with anything.
package consumer

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxkit/orders/internal/consumer/internal/consumerdb"
	"github.com/outboxkit/orders/internal/webhook"
	"github.com/outboxkit/orders/openapi"
)

// Event types the consumer applies; anything else is acknowledged and
// recorded in the inbox without an effect, so a sender that adds event types
// never gets stuck retrying them against an older consumer.
const (
	EventPlaced    = "order.placed"
	EventCancelled = "order.cancelled"
)

// schemas check the data of the events the consumer applies: the schemas
// the sender publishes (openapi.Description's webhooks), at the versions
// this code was written for. Read once: they are part of the build.
var schemas = mustCompileSchemas(map[string]int{EventPlaced: 1, EventCancelled: 1})

// mustCompileSchemas compiles each type's published schema, and panics if
// the description lacks it or has another version: code written for one
// version cannot be trusted with the next.
func mustCompileSchemas(versions map[string]int) map[string]*jsonschema.Schema {
	out := map[string]*jsonschema.Schema{}
	for typ, want := range versions {
		schema, version, err := openapi.EventSchema(typ)
		if err == nil && version != want {
			err = fmt.Errorf("the description has version %d of %s, this consumer reads version %d", version, typ, want)
		}
		if err != nil {
			panic(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
		if err != nil {
			panic(fmt.Errorf("reading the schema of %s: %w", typ, err))
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource(typ+".json", doc); err != nil {
			panic(err)
		}
		out[typ] = c.MustCompile(typ + ".json")
	}
	return out
}

// checkData says why data is not what the schema of typ allows; nil for
// valid data, or a type the consumer has no schema for.
func checkData(typ string, data json.RawMessage) error {
	s, ok := schemas[typ]
	if !ok {
		return nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if err := s.Validate(v); err != nil {
		// Its lines name each field and what is wrong with it.
		return errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return nil
}

// MaxBody bounds a delivery's body; the order service's own limit on an
// order request is 1 MiB, and its event is smaller than the request.
const MaxBody = 1 << 20

// VersionTable is the consumer's goose version table. It is not goose's
// default, so the consumer's history never mixes with another service's
// in a shared database.
const VersionTable = "consumer_goose_db_version"

// migrationLockID is the advisory lock that serialises the consumer's
// migrations; it differs from goose's default, which the orders service uses.
const migrationLockID int64 = 0x636f6e73756d6572 // "consumer"

//go:embed migrations/*.sql
var embedded embed.FS

// Migrations is the consumer's schema history.
var Migrations, _ = fs.Sub(embedded, "migrations")

// Migrate applies the consumer's pending migrations. Several consumers may
// start at once (an advisory lock serialises them); running it again changes
// nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID))
	if err != nil {
		return fmt.Errorf("creating migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, Migrations,
		goose.WithSessionLocker(locker), goose.WithTableName(VersionTable))
	if err != nil {
		return fmt.Errorf("creating migration provider: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return fmt.Errorf("applying consumer migrations: %w", err)
	}
	for _, r := range results {
		logger.InfoContext(ctx, "applied migration",
			slog.Int64("version", r.Source.Version), slog.String("file", r.Source.Path))
	}
	return nil
}

// Outcome is what the consumer did with one delivery; it labels the metrics
// and the JSON answer.
type Outcome string

// Outcomes, one per way a delivery can end.
const (
	// Applied: verified, new, and its effect committed with its inbox row.
	Applied Outcome = "applied"
	// Duplicate: verified, and its webhook-id was already in the inbox.
	Duplicate Outcome = "duplicate"
	// Ignored: verified and new, but of an event type the consumer does not
	// handle; recorded in the inbox so it is acknowledged once and for all.
	Ignored Outcome = "ignored"
	// BadSignature: missing headers or no signature matched any secret.
	BadSignature Outcome = "bad_signature"
	// StaleTimestamp: signed, maybe, but outside the tolerance: a replay or
	// a badly skewed clock.
	StaleTimestamp Outcome = "stale_timestamp"
	// BadRequest: authentic but unreadable, or too large.
	BadRequest Outcome = "bad_request"
	// OutOfOrder: an order.cancelled before its order's order.placed. The
	// sender orders an order's events, so this is a defect somewhere: it is
	// refused with 409 (nothing recorded) and the sender retries later.
	OutOfOrder Outcome = "out_of_order"
	// TooOld: authentic and not in the inbox, but written longer ago than
	// the inbox remembers ids (WithInboxRetention): it may have been
	// applied already and its id forgotten since, so applying it could
	// apply it twice. It is refused with 422 (nothing recorded), and
	// logged as an error: the sender's retention, a long pause or a late
	// redelivery outlasted the inbox's.
	TooOld Outcome = "too_old"
	// Error: the database failed; the sender retries later.
	Error Outcome = "error"
)

var outcomes = []Outcome{Applied, Duplicate, Ignored, BadSignature, StaleTimestamp, BadRequest, OutOfOrder, TooOld, Error}

// Consumer receives webhooks and applies them exactly once. It is an
// http.Handler for the webhook endpoint; StatsHandler serves its counters.
type Consumer struct {
	pool     *pgxpool.Pool
	verifier *webhook.Verifier
	logger   *slog.Logger
	counts   map[Outcome]*atomic.Int64
	started  time.Time

	// retention is how long the inbox remembers an id (0: for ever).
	retention time.Duration
	// lag is commit to applied, by event; lateAfter the lag past which an
	// applied event is logged (0: none is).
	lag       prometheus.Histogram
	lateAfter time.Duration

	// brokers

	// JetStream redelivery: natsRetryDelay, natsRetryMax and
	// natsOutOfOrderDeliveries, but in the tests of those bounds.
	natsRetry, natsRetryMax time.Duration
	natsOutOfOrder          uint64
	outOfOrder              outOfOrderCounts
	// /brokers
}

// Option configures a Consumer beyond its required parts.
type Option func(*Consumer)

// WithInboxRetention tells the consumer how long its inbox remembers a
// webhook-id: the retention PruneInbox is run with. An event written
// longer ago than that and not in the inbox is refused (TooOld), since
// its id may have been forgotten after it was applied. Without it, events
// of any age are applied, which is right only for an inbox never pruned.
func WithInboxRetention(d time.Duration) Option {
	return func(c *Consumer) { c.retention = d }
}

// WithLateAfter makes the consumer log, as a warning, each event it
// applies later than d after the event was written: the lag its receivers
// notice. Without it, or with 0, none is logged; the histogram
// (consumer_event_lag_seconds) has them all.
func WithLateAfter(d time.Duration) Option {
	return func(c *Consumer) { c.lateAfter = d }
}

// New returns a consumer that verifies deliveries with verifier and applies
// them in pool's database (migrated with Migrate). A consumer that receives
// no webhook verifies nothing: verifier may then be nil.
func New(pool *pgxpool.Pool, verifier *webhook.Verifier, logger *slog.Logger, opts ...Option) *Consumer {
	c := &Consumer{pool: pool, verifier: verifier, logger: logger,
		counts: map[Outcome]*atomic.Int64{}, started: time.Now(),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "consumer_event_lag_seconds",
			Help: "From each event's writing (its time, on the sender's database clock) to the commit of its effect here, for the events applied (duplicates and ignored types left out): the sender's queueing, retries and pauses, the transport and this consumer's own wait, all in one.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800,
				3600, 7200, 21600, 43200, 86400},
		})}
	// brokers
	c.natsRetry, c.natsRetryMax, c.natsOutOfOrder = natsRetryDelay, natsRetryMax, natsOutOfOrderDeliveries
	// /brokers
	for _, o := range outcomes {
		c.counts[o] = &atomic.Int64{}
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// envelope is the Standard Webhooks body the orders service sends.
type envelope struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// order is the part of the event's order the ledger needs.
type order struct {
	ID         uuid.UUID `json:"id"`
	CustomerID string    `json:"customer_id"`
	TotalCents int64     `json:"total_cents"`
}

// ServeHTTP handles one delivery. Every answer is a deliberate signal to the
// sender: 2xx stops retries (applied, duplicate, ignored), 401 and 400 mean
// the request itself is wrong, 409 and 500 mean "try again later".
func (c *Consumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		c.answer(w, http.StatusMethodNotAllowed, BadRequest, "POST only")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		c.answer(w, http.StatusRequestEntityTooLarge, BadRequest, "body unreadable or over 1 MiB")
		return
	}
	// Authenticate before parsing: an unauthenticated body is not input.
	if err := c.verifier.Verify(r.Header, body); err != nil {
		outcome := BadSignature
		if errors.Is(err, webhook.ErrTimestampOutOfTolerance) || errors.Is(err, webhook.ErrInvalidTimestamp) {
			outcome = StaleTimestamp
		}
		// The error names which check failed, never a secret or a signature.
		c.logger.WarnContext(r.Context(), "webhook rejected", slog.String("outcome", string(outcome)),
			slog.String("error", err.Error()), slog.String("remote", r.RemoteAddr))
		c.answer(w, http.StatusUnauthorized, outcome, "signature verification failed")
		return
	}
	id := r.Header.Get(webhook.HeaderID)
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		c.answer(w, http.StatusBadRequest, BadRequest, "body is not a webhook envelope")
		return
	}
	if env.ID != id {
		c.answer(w, http.StatusBadRequest, BadRequest, "body id does not match the webhook-id header")
		return
	}

	outcome, err := c.apply(r.Context(), id, env)
	if err != nil {
		var bad *badEvent
		if errors.As(err, &bad) {
			c.answer(w, http.StatusBadRequest, BadRequest, bad.Error())
			return
		}
		if errors.Is(err, errOutOfOrder) {
			c.logger.WarnContext(r.Context(), "webhook out of order", slog.String("webhook_id", id), slog.String("type", env.Type))
			c.answer(w, http.StatusConflict, OutOfOrder, err.Error())
			return
		}
		if errors.Is(err, errTooOld) {
			c.logTooOld(r.Context(), id, env)
			c.answer(w, http.StatusUnprocessableEntity, TooOld, err.Error())
			return
		}
		c.logger.ErrorContext(r.Context(), "applying webhook", slog.String("webhook_id", id), slog.String("error", err.Error()))
		c.answer(w, http.StatusInternalServerError, Error, "could not apply the event; retry later")
		return
	}
	c.logger.DebugContext(r.Context(), "webhook handled", slog.String("webhook_id", id),
		slog.String("type", env.Type), slog.String("outcome", string(outcome)))
	c.answer(w, http.StatusOK, outcome, "")
}

// errOutOfOrder refuses an order.cancelled that came before its
// order.placed.
var errOutOfOrder = errors.New("order.cancelled before its order.placed; retry later")

// errTooOld refuses an event older than the inbox's retention.
var errTooOld = errors.New("event is older than the inbox's retention: its id may have been forgotten after it was applied, " +
	"so it is not applied again")

// logTooOld logs a refused TooOld event, as an error: an event lost to
// the consumer unless someone looks (the sender's retention, or a pause,
// outlasted the inbox's).
func (c *Consumer) logTooOld(ctx context.Context, id string, env envelope) {
	c.logger.ErrorContext(ctx, "event older than the inbox retention refused", slog.String("event_id", id),
		slog.String("type", env.Type), slog.Time("created_at", env.CreatedAt), slog.Duration("inbox_retention", c.retention))
}

// badEvent is an authentic event the consumer cannot read.
type badEvent struct{ msg string }

func (e *badEvent) Error() string { return e.msg }

// apply records the webhook-id and the event's effect in one transaction:
// both commit or neither does, which is the whole of exactly-once.
func (c *Consumer) apply(ctx context.Context, id string, env envelope) (Outcome, error) {
	outcome := Applied
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		q := consumerdb.New(tx)
		n, err := q.InboxRecord(ctx, id, env.Type)
		if err != nil {
			return fmt.Errorf("recording webhook-id: %w", err)
		}
		if n == 0 {
			outcome = Duplicate
			return nil
		}
		if c.retention > 0 && env.CreatedAt.Before(time.Now().Add(-c.retention)) {
			// Rolls back the inbox row. Checked after the inbox, so that
			// an old event still remembered is the duplicate it is.
			return errTooOld
		}
		var sign, placed, cancelled int64
		switch env.Type {
		case EventPlaced:
			sign, placed = 1, 1
		case EventCancelled:
			sign, cancelled = -1, 1
		default:
			outcome = Ignored
			return nil
		}
		if err := checkData(env.Type, env.Data); err != nil {
			return &badEvent{msg: "event data is not an order as " + env.Type + "'s schema says: " + err.Error()}
		}
		var o order
		if err := json.Unmarshal(env.Data, &o); err != nil {
			return &badEvent{msg: "event data is not an order"}
		}
		if env.Type == EventCancelled {
			placed, err := q.LedgerHasPlaced(ctx, o.ID)
			if err != nil {
				return fmt.Errorf("finding the order's placement: %w", err)
			}
			if !placed {
				// Rolls back the inbox row: the retry applies it.
				return errOutOfOrder
			}
		}
		if err := q.LedgerAppend(ctx, consumerdb.LedgerAppendParams{
			WebhookID: id, CustomerID: o.CustomerID, OrderID: o.ID, EventType: env.Type,
			AmountCents: sign * o.TotalCents, OccurredAt: env.CreatedAt,
		}); err != nil {
			return fmt.Errorf("appending to ledger: %w", err)
		}
		if err := q.CustomerApply(ctx, consumerdb.CustomerApplyParams{
			CustomerID: o.CustomerID, Placed: placed, Cancelled: cancelled, AmountCents: sign * o.TotalCents,
		}); err != nil {
			return fmt.Errorf("updating customer balance: %w", err)
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
		// A data exception (a balance out of range, say) fails the same way
		// on every retry: the event is unusable here, like unreadable data,
		// not a failure of the database to retry later. Answered as a
		// server error it would be retried to the end, and the sender would
		// back off every other event to this endpoint meanwhile.
		return "", &badEvent{msg: "event cannot be applied: " + pgErr.Message}
	}
	if err != nil {
		return "", err
	}
	if outcome == Applied {
		c.applied(ctx, id, env)
	}
	return outcome, nil
}

// applied measures how late an event's effect committed, from its event's
// time, and logs it when later than the threshold.
func (c *Consumer) applied(ctx context.Context, id string, env envelope) {
	lag := time.Since(env.CreatedAt)
	c.lag.Observe(lag.Seconds())
	if c.lateAfter > 0 && lag > c.lateAfter {
		c.logger.WarnContext(ctx, "event applied late", slog.String("event_id", id), slog.String("type", env.Type),
			slog.Time("created_at", env.CreatedAt), slog.Duration("lag", lag), slog.Duration("late_after", c.lateAfter))
	}
}

// answer writes a small JSON answer and counts the outcome.
func (c *Consumer) answer(w http.ResponseWriter, status int, outcome Outcome, detail string) {
	c.counts[outcome].Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Outcome Outcome `json:"outcome"`
		Detail  string  `json:"detail,omitempty"`
	}{outcome, detail})
}

// Stats is what the consumer has done: counters since the process started,
// and the totals in its database, which survive restarts.
type Stats struct {
	Applied        int64 `json:"applied"`
	Duplicates     int64 `json:"duplicates"`
	Ignored        int64 `json:"ignored"`
	BadSignature   int64 `json:"bad_signature"`
	StaleTimestamp int64 `json:"stale_timestamp"`
	BadRequest     int64 `json:"bad_request"`
	OutOfOrder     int64 `json:"out_of_order"`
	TooOld         int64 `json:"too_old"`
	Errors         int64 `json:"errors"`
	// InboxTotal counts every webhook-id ever recorded, LedgerTotal every
	// ledger entry: with only order events they are equal.
	InboxTotal    int64   `json:"inbox_total"`
	LedgerTotal   int64   `json:"ledger_total"`
	UptimeSeconds float64 `json:"uptime_seconds"`
}

// inboxPruneBatch keeps each delete of PruneInbox short, so it never holds
// up the deliveries being applied beside it.
const inboxPruneBatch = 5000

// PruneInbox forgets the webhook-ids received before before, in batches,
// and returns how many. A delivery of a forgotten id would be applied
// again, so before must lie beyond everything the sender may still send
// again: its retries (the order service gives up after 27.6 hours at its
// defaults, up to 30.4 with their jitter, and a paused endpoint waits
// longer) and its replays, which re-send events it still keeps
// (OUTBOX_RETENTION, 7 days by default) under their original ids. The
// ledger keeps its entries; only the dedup record goes.
func (c *Consumer) PruneInbox(ctx context.Context, before time.Time) (int64, error) {
	q := consumerdb.New(c.pool)
	var total int64
	for {
		n, err := q.InboxPrune(ctx, before, inboxPruneBatch)
		total += n
		if err != nil {
			return total, fmt.Errorf("pruning the inbox: %w", err)
		}
		if n < inboxPruneBatch {
			return total, nil
		}
	}
}

// Stats returns the counters and the database totals.
func (c *Consumer) Stats(ctx context.Context) (Stats, error) {
	t, err := consumerdb.New(c.pool).Totals(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("counting inbox and ledger: %w", err)
	}
	return Stats{
		Applied: c.counts[Applied].Load(), Duplicates: c.counts[Duplicate].Load(), Ignored: c.counts[Ignored].Load(),
		BadSignature: c.counts[BadSignature].Load(), StaleTimestamp: c.counts[StaleTimestamp].Load(),
		BadRequest: c.counts[BadRequest].Load(), OutOfOrder: c.counts[OutOfOrder].Load(), TooOld: c.counts[TooOld].Load(),
		Errors:     c.counts[Error].Load(),
		InboxTotal: t.Inbox, LedgerTotal: t.Ledger, UptimeSeconds: time.Since(c.started).Seconds(),
	}, nil
}

// StatsHandler serves Stats as JSON (GET /stats).
func (c *Consumer) StatsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := c.Stats(r.Context())
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			c.logger.ErrorContext(r.Context(), "reading stats", slog.String("error", err.Error()))
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "database unavailable"})
			return
		}
		_ = json.NewEncoder(w).Encode(s)
	})
}

// Collectors returns Prometheus collectors for the outcome counters
// (consumer_webhooks_total{outcome}), read at scrape time, and for the
// events' lag (consumer_event_lag_seconds).
func (c *Consumer) Collectors() []prometheus.Collector {
	cs := make([]prometheus.Collector, 0, len(outcomes)+1)
	cs = append(cs, c.lag)
	for _, o := range outcomes {
		n := c.counts[o]
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "consumer_webhooks_total",
			Help:        "Webhook deliveries received, by outcome.",
			ConstLabels: prometheus.Labels{"outcome": string(o)},
		}, func() float64 { return float64(n.Load()) }))
	}
	return cs
}

// Customer is a customer's running balance, as the ledger's effects left it.
type Customer = consumerdb.ConsumerCustomer

// Entry is one ledger entry.
type Entry = consumerdb.ConsumerLedger

// Customer returns a customer's balance, or pgx.ErrNoRows.
func (c *Consumer) Customer(ctx context.Context, customerID string) (Customer, error) {
	cust, err := consumerdb.New(c.pool).CustomerGet(ctx, customerID)
	if err != nil {
		return Customer{}, fmt.Errorf("reading customer %q: %w", customerID, err)
	}
	return cust, nil
}

// Ledger returns a customer's ledger entries, oldest first.
func (c *Consumer) Ledger(ctx context.Context, customerID string) ([]Entry, error) {
	entries, err := consumerdb.New(c.pool).LedgerForCustomer(ctx, customerID)
	if err != nil {
		return nil, fmt.Errorf("reading ledger of %q: %w", customerID, err)
	}
	return entries, nil
}
