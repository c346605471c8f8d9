// Package orders is the orders module: placing and cancelling orders, each
// change committed in one transaction together with its outbox message, so
// "order.placed" is announced exactly when an order exists.
//
// It may use the outbox module; the outbox never uses it.
package orders

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/orders/internal/ordersdb"
	"github.com/outboxkit/orders/internal/outbox"
)

// Order statuses.
const (
	StatusPlaced    = "placed"
	StatusCancelled = "cancelled"
)

// Limits on an order request; beyond them a request is refused, not truncated.
const (
	MaxLines          = 100
	MaxQuantity       = 1_000_000
	MaxUnitPriceCents = 1_000_000_000_00 // one billion in major units
	maxTextLen        = 200
	maxKeyLen         = 255
)

var (
	// ErrNotFound is returned for an order that does not exist.
	ErrNotFound = errors.New("orders: order not found")
	// ErrIdempotencyConflict is returned when an Idempotency-Key is reused
	// with a different request.
	ErrIdempotencyConflict = errors.New("orders: idempotency key already used with a different request")
)

// ValidationError says what is wrong with a request; nothing was written.
type ValidationError struct {
	Field  string
	Reason string
}

// Error implements error.
func (e *ValidationError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Line is one order line.
type Line struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// Order is an order as the API returns it and as its events carry it.
type Order struct {
	ID          uuid.UUID  `json:"id"`
	CustomerID  string     `json:"customer_id"`
	Status      string     `json:"status"`
	TotalCents  int64      `json:"total_cents"`
	Lines       []Line     `json:"lines"`
	CreatedAt   time.Time  `json:"created_at"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
}

// PlaceRequest is what a client asks to order.
type PlaceRequest struct {
	CustomerID string `json:"customer_id"`
	Lines      []Line `json:"lines"`
	// IdempotencyKey, when set, makes a retried request return the first
	// order instead of placing a second one.
	IdempotencyKey string `json:"-"`
}

// Service places and cancels orders.
type Service struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

// NewService returns the orders service.
func NewService(pool *pgxpool.Pool, logger *slog.Logger) *Service {
	return &Service{pool: pool, logger: logger}
}

// validate checks a request and returns its total.
func (req PlaceRequest) validate() (int64, error) {
	if strings.TrimSpace(req.CustomerID) == "" {
		return 0, &ValidationError{"customer_id", "is required"}
	}
	if err := checkText("customer_id", req.CustomerID, maxTextLen); err != nil {
		return 0, err
	}
	if len(req.Lines) == 0 {
		return 0, &ValidationError{"lines", "must hold at least one line"}
	}
	if len(req.Lines) > MaxLines {
		return 0, &ValidationError{"lines", fmt.Sprintf("must hold at most %d lines, got %d", MaxLines, len(req.Lines))}
	}
	if err := checkText("idempotency key", req.IdempotencyKey, maxKeyLen); err != nil {
		return 0, err
	}
	var total int64
	for i, l := range req.Lines {
		field := func(name string) string { return fmt.Sprintf("lines[%d].%s", i, name) }
		if strings.TrimSpace(l.SKU) == "" {
			return 0, &ValidationError{field("sku"), "is required"}
		}
		if err := checkText(field("sku"), l.SKU, maxTextLen); err != nil {
			return 0, err
		}
		if l.Quantity < 1 || l.Quantity > MaxQuantity {
			return 0, &ValidationError{field("quantity"), fmt.Sprintf("must be from 1 to %d, got %d", MaxQuantity, l.Quantity)}
		}
		if l.UnitPriceCents < 0 || l.UnitPriceCents > MaxUnitPriceCents {
			return 0, &ValidationError{field("unit_price_cents"), fmt.Sprintf("must be from 0 to %d, got %d", int64(MaxUnitPriceCents), l.UnitPriceCents)}
		}
		hi, amount := bits.Mul64(uint64(l.Quantity), uint64(l.UnitPriceCents))
		if hi != 0 || amount > math.MaxInt64 || total > math.MaxInt64-int64(amount) {
			return 0, &ValidationError{"lines", "order total overflows"}
		}
		total += int64(amount)
	}
	return total, nil
}

func checkText(field, s string, maxLen int) error {
	if len(s) > maxLen {
		return &ValidationError{field, fmt.Sprintf("must be at most %d bytes", maxLen)}
	}
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return &ValidationError{field, "must be valid UTF-8 text"}
	}
	return nil
}

// hash identifies a request's content, to tell a retry from a different
// request reusing an idempotency key.
func (req PlaceRequest) hash() []byte {
	b, _ := json.Marshal(struct {
		CustomerID string `json:"customer_id"`
		Lines      []Line `json:"lines"`
	}{req.CustomerID, req.Lines})
	sum := sha256.Sum256(b)
	return sum[:]
}

// Place places an order and emits "order.placed" in the same transaction.
// replayed reports that the idempotency key matched an earlier identical
// request: that order is returned and nothing new is written or emitted.
func (s *Service) Place(ctx context.Context, req PlaceRequest) (order Order, replayed bool, err error) {
	total, err := req.validate()
	if err != nil {
		return Order{}, false, err
	}
	var key *string
	var reqHash []byte
	if req.IdempotencyKey != "" {
		key, reqHash = &req.IdempotencyKey, req.hash()
	}

	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := ordersdb.New(tx)
		var row ordersdb.Order
		// Order ids are time-ordered (UUIDv7), as the outbox's are: each
		// insert lands on the primary key's last page, where random ids
		// would dirty a page anywhere in an index that grows with every
		// order, so the WAL and the evictions per order would grow with it.
		// Twice at most: the key's order may have its key expired
		// (ExpireIdempotencyKeys) between the insert that found it and the
		// lookup; then the key is free and the second insert takes it.
		for try := 0; ; try++ {
			var id uuid.UUID
			if id, err = uuid.NewV7(); err != nil {
				return fmt.Errorf("making order id: %w", err)
			}
			row, err = q.OrderInsert(ctx, ordersdb.OrderInsertParams{
				ID: id, CustomerID: req.CustomerID, TotalCents: total,
				IdempotencyKey: key, RequestHash: reqHash,
			})
			if !errors.Is(err, pgx.ErrNoRows) {
				break
			}
			order, err = s.replay(ctx, q, req.IdempotencyKey, reqHash)
			if errors.Is(err, pgx.ErrNoRows) && try == 0 {
				continue
			}
			replayed = err == nil
			return err
		}
		if err != nil {
			return fmt.Errorf("inserting order: %w", err)
		}

		p := ordersdb.OrderLinesInsertParams{OrderID: row.ID}
		for _, l := range req.Lines {
			p.Skus = append(p.Skus, l.SKU)
			p.Quantities = append(p.Quantities, int32(l.Quantity))
			p.UnitPricesCents = append(p.UnitPricesCents, l.UnitPriceCents)
		}
		order = toOrder(row, req.Lines)
		// The lines and the event go in one round trip (a batch): the
		// outbox adds a statement to the transaction, not a round trip.
		var b pgx.Batch
		ordersdb.QueueOrderLinesInsert(&b, p)
		if _, err := outbox.Queue(ctx, tx, &b, outbox.Event{Type: EventPlaced, Data: order, OrderingKey: order.ID.String()}); err != nil {
			return fmt.Errorf("enqueuing %s: %w", EventPlaced, err)
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return fmt.Errorf("inserting order lines and %s: %w", EventPlaced, outbox.Classify(err))
		}
		return nil
	})
	if err != nil {
		return Order{}, false, err
	}
	if !replayed {
		s.logger.InfoContext(ctx, "order placed", slog.String("order_id", order.ID.String()),
			slog.Int64("total_cents", order.TotalCents))
	}
	return order, replayed, nil
}

// DefaultIdempotencyTTL is how long an idempotency key dedupes, as Stripe's
// do: a client's retries come within minutes, and a day covers a retry
// queue that waited out an outage.
const DefaultIdempotencyTTL = 24 * time.Hour

// expireBatch bounds each statement of ExpireIdempotencyKeys, so its row
// locks never hold up order transactions for long.
const expireBatch = 1000

// ExpireIdempotencyKeys clears the idempotency keys of orders placed more
// than ttl ago, in batches, and returns how many it cleared. The orders
// stay; only their keys go, so the same key then places a new order. The
// worker runs it periodically (a relay chore).
func (s *Service) ExpireIdempotencyKeys(ctx context.Context, ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("expiring idempotency keys: ttl must be positive, got %s", ttl)
	}
	return s.expireIdempotencyKeys(ctx, ttl, expireBatch)
}

func (s *Service) expireIdempotencyKeys(ctx context.Context, ttl time.Duration, batch int32) (int64, error) {
	q := ordersdb.New(s.pool)
	var total int64
	for {
		n, err := q.OrderIdempotencyKeysExpire(ctx, ttl.Seconds(), batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("expiring idempotency keys: %w", err)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// replay returns the order an idempotency key already placed, if the request
// is the same one.
func (s *Service) replay(ctx context.Context, q *ordersdb.Queries, key string, reqHash []byte) (Order, error) {
	row, err := q.OrderGetByIdempotencyKey(ctx, &key)
	if err != nil {
		return Order{}, fmt.Errorf("reading order for idempotency key: %w", err)
	}
	if string(row.RequestHash) != string(reqHash) {
		return Order{}, ErrIdempotencyConflict
	}
	return s.load(ctx, q, row)
}

// Get returns an order.
func (s *Service) Get(ctx context.Context, id uuid.UUID) (Order, error) {
	q := ordersdb.New(s.pool)
	row, err := q.OrderGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, fmt.Errorf("reading order: %w", err)
	}
	return s.load(ctx, q, row)
}

// EventKey is the ordering key of order id's events, its id, once the
// order is known: the ops page's search lists an order's events, whenever
// they were written, by their key (outbox_events_ordering_key_idx).
func (s *Service) EventKey(ctx context.Context, id uuid.UUID) (string, error) {
	row, err := ordersdb.New(s.pool).OrderGet(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("reading order: %w", err)
	}
	return row.ID.String(), nil
}

// Cancel cancels a placed order and emits "order.cancelled" in the same
// transaction. Cancelling a cancelled order returns it and emits nothing.
func (s *Service) Cancel(ctx context.Context, id uuid.UUID) (Order, error) {
	var order Order
	var changed bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := ordersdb.New(tx)
		row, err := q.OrderCancel(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			// Not placed: missing, or past placing (cancelled before).
			row, err = q.OrderGet(ctx, id)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			if err != nil {
				return fmt.Errorf("reading order: %w", err)
			}
			order, err = s.load(ctx, q, row)
			return err
		}
		if err != nil {
			return fmt.Errorf("cancelling order: %w", err)
		}
		if order, err = s.load(ctx, q, row); err != nil {
			return err
		}
		changed = true
		if _, err := outbox.Enqueue(ctx, tx, outbox.Event{Type: EventCancelled, Data: order, OrderingKey: order.ID.String()}); err != nil {
			return fmt.Errorf("enqueuing %s: %w", EventCancelled, err)
		}
		return nil
	})
	if err != nil {
		return Order{}, err
	}
	if changed {
		s.logger.InfoContext(ctx, "order cancelled", slog.String("order_id", id.String()))
	}
	return order, nil
}

func (s *Service) load(ctx context.Context, q *ordersdb.Queries, row ordersdb.Order) (Order, error) {
	rows, err := q.OrderLinesGet(ctx, row.ID)
	if err != nil {
		return Order{}, fmt.Errorf("reading order lines: %w", err)
	}
	lines := make([]Line, len(rows))
	for i, l := range rows {
		lines[i] = Line{SKU: l.Sku, Quantity: int64(l.Quantity), UnitPriceCents: l.UnitPriceCents}
	}
	return toOrder(row, lines), nil
}

func toOrder(row ordersdb.Order, lines []Line) Order {
	return Order{ID: row.ID, CustomerID: row.CustomerID, Status: row.Status, TotalCents: row.TotalCents,
		Lines: lines, CreatedAt: row.CreatedAt, CancelledAt: row.CancelledAt}
}
