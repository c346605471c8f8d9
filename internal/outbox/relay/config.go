package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/secretbox"
)

// Config tunes the relay. The zero value of a field means its default.
type Config struct {
	// PollInterval is how often each relay looks for destinations with due
	// messages, and how often a deliver job looks again for new ones.
	PollInterval time.Duration
	// BatchSize bounds how many messages one claim statement takes; a claim
	// never takes more than the destination has room for in flight.
	BatchSize int
	// MaxAttempts is the cap after which a message is marked failed.
	MaxAttempts int
	// RetrySchedule is the delay before each retry: the first entry after
	// the first failed attempt, and so on; past its end the last entry
	// repeats. Each delay varies by up to ±10% so that a burst of failures
	// does not come back as a burst.
	RetrySchedule []time.Duration
	// BackoffBase, when set, replaces RetrySchedule with exponential backoff
	// from BackoffBase, doubling per attempt ("equal jitter"), up to
	// BackoffMax (an hour when unset). BackoffMax alone caps the schedule's
	// delays.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// DestinationConcurrency bounds the requests in flight to one destination,
	// across every relay: one deliver job at a time serves a destination,
	// with at most this many requests. Below it the pace adapts to what the
	// receiver takes (pace.go).
	DestinationConcurrency int
	// DeliverWorkers is how many destinations one relay process serves at
	// once (River workers on the deliver queue).
	DeliverWorkers int
	// CircuitThreshold is how many endpoint-wide failures in a row (refused,
	// timed out, 5xx, 429...) make a destination back off as a whole: nothing
	// more is sent until a probe of one message succeeds.
	CircuitThreshold int
	// ProbeIntervalMax caps the wait between probes of a destination that is
	// backing off: the first comes after 5 seconds, and each failed probe
	// doubles the wait up to this.
	ProbeIntervalMax time.Duration
	// RelayTimeout is how long a relay's heartbeat may be silent before the
	// other relays declare it dead and deliver its claimed messages.
	RelayTimeout time.Duration
	// ClaimTimeout is the last resort: a claim this relay made, older than
	// this, is returned to pending by whichever relay looks, as a relay
	// that is alive but stuck would otherwise hold it forever.
	ClaimTimeout time.Duration
	// DeliveryTimeout bounds one webhook request.
	DeliveryTimeout time.Duration
	// Retention is how long delivered (and discarded) rows are kept, and
	// events.
	Retention time.Duration
	// FailedRetention is how long failed rows are kept, with their attempt
	// history, for a person to retry or skip them; after it the prune job
	// deletes them (and then their events, once past Retention). Long by
	// default: a failed message is one someone may still need.
	FailedRetention time.Duration
	// PruneInterval is how often the prune job runs.
	PruneInterval time.Duration
	// PartitionSpan is the time one partition of the outbox tables holds
	// (by the time in their ids). The prune job drops a partition whole
	// once every row in it is settled and past its retention, so a
	// delivered row is kept for Retention and at most one span more; each
	// partition costs every statement on the tables a little (see
	// docs/operations.md), so a span far below the retention costs more
	// than it saves.
	PartitionSpan time.Duration
	// PartitionsAhead is how far ahead of now the prune job keeps
	// partitions made: an order transaction whose rows find no partition
	// fails, so this is the time a stopped prune job leaves before that.
	PartitionsAhead time.Duration
	// Chores are other modules' periodic upkeep (the orders module's expiry
	// of idempotency keys, say), run by the relay's River leader like the
	// prune job: once per interval however many relays run.
	Chores []Chore
	// Listen wakes the relay when a transaction commits an event (Enqueue on
	// a connection set up by NotifyRelays) instead of at its next poll: it
	// LISTENs on a connection of its own. The poll goes on and stays what
	// makes delivery correct.
	Listen bool
	// SecretKeys open the endpoints' signing secrets when they are sealed
	// (see WithSecretKeys). Nil reads secrets stored in the clear only: a
	// delivery whose secret is sealed then fails, naming the key it needs.
	SecretKeys *secretbox.Keyring
	// TracerProvider, when set, traces the relay: a span per delivery, in the
	// trace of the request that enqueued the message, and River's jobs
	// (otelriver). Nil means tracing off; a message that carries a trace
	// context still passes it on to its receiver.
	TracerProvider trace.TracerProvider
}

// Chore is a periodic task of another module that the relay runs: Run is
// called once per Interval (PruneInterval when zero) on the River leader,
// one chore at a time, and never twice at once. An error is logged and the
// chore runs again at its next interval, so Run should make progress in
// bounded batches and be safe to repeat.
type Chore struct {
	// Name identifies the chore in River's jobs and the logs: unique,
	// snake_case.
	Name     string
	Interval time.Duration
	Run      func(ctx context.Context) error
}

// DefaultRetrySchedule spans a little over a day (27.6 hours before the
// eighth and last attempt fails), so a receiver that is down for a day
// loses nothing: immediately, then after 5 seconds, 5 minutes, 30 minutes,
// 2, 5, 10 and 10 hours.
var DefaultRetrySchedule = []time.Duration{
	5 * time.Second, 5 * time.Minute, 30 * time.Minute,
	2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour,
}

// DefaultConfig returns the defaults, chosen for webhook delivery on a
// small machine: sub-second latency when idle, retries for a day, and a
// week of audit history.
func DefaultConfig() Config {
	return Config{
		PollInterval:           50 * time.Millisecond, // was 200 ms: p50 110 → 29 ms at 200 orders/s, measured by the lab's bench
		BatchSize:              500,
		MaxAttempts:            len(DefaultRetrySchedule) + 1,
		RetrySchedule:          DefaultRetrySchedule,
		DestinationConcurrency: 32,
		DeliverWorkers:         50,
		CircuitThreshold:       5,
		ProbeIntervalMax:       time.Minute,
		RelayTimeout:           5 * time.Second,
		ClaimTimeout:           5 * time.Minute,
		DeliveryTimeout:        10 * time.Second,
		Retention:              7 * 24 * time.Hour,
		FailedRetention:        30 * 24 * time.Hour,
		PruneInterval:          time.Hour,
		PartitionSpan:          48 * time.Hour,
		PartitionsAhead:        72 * time.Hour,
	}
}

// withDefaults fills every zero field from DefaultConfig, so a new
// knob needs only its field and its default.
func (c Config) withDefaults() Config {
	def := reflect.ValueOf(DefaultConfig())
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); v.Type().Field(i).IsExported() && f.IsZero() {
			f.Set(def.Field(i))
		}
	}
	if c.BackoffBase > 0 && c.BackoffMax == 0 {
		c.BackoffMax = time.Hour
	}
	return c
}

// FieldError is a Config problem, naming the field it is about so a
// caller can name its own setting (an environment variable, a flag).
type FieldError struct {
	Field string
	Msg   string
}

// Error implements error.
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// riverFetchCooldown is the relay's River client's FetchCooldown: how
// soon after an insert River's workers fetch, and the shortest poll
// interval the relay takes.
const riverFetchCooldown = 10 * time.Millisecond

// maxCount bounds the relay's per-destination counts (DestinationConcurrency,
// BatchSize).
const maxCount = 10_000

// Validate reports settings that cannot work together, as *FieldError values
// joined with errors.Join.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	// Every count and duration: none may be negative.
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if f := v.Field(i); v.Type().Field(i).IsExported() && (f.Kind() == reflect.Int || f.Kind() == reflect.Int64) && f.Int() < 0 {
			fail(v.Type().Field(i).Name, "must be positive, got %v", f.Interface())
		}
	}
	seen := map[string]bool{}
	for _, ch := range c.Chores {
		switch {
		case ch.Name == "" || ch.Run == nil:
			fail("Chores", "a chore needs a name and a Run function")
		case seen[ch.Name]:
			fail("Chores", "two chores are named %q", ch.Name)
		case ch.Interval < 0:
			fail("Chores", "%s: interval must be positive, got %s", ch.Name, ch.Interval)
		}
		seen[ch.Name] = true
	}
	if c.RetrySchedule != nil && len(c.RetrySchedule) == 0 {
		// nil takes the default; an empty schedule has no wait to give.
		fail("RetrySchedule", "must hold at least one wait (nil for the default)")
	}
	// A wait is varied by ±10 %, which overflows past 29 years; no wait
	// between two attempts needs to be a year.
	const longestWait = 365 * 24 * time.Hour
	for i, d := range c.RetrySchedule {
		if d <= 0 || d > longestWait {
			fail("RetrySchedule", "entry %d must be from 1ns to %s, got %s", i+1, longestWait, d)
		}
	}
	if c.BackoffBase > 0 && c.BackoffMax < c.BackoffBase {
		fail("BackoffMax", "%s is below the backoff base %s", c.BackoffMax, c.BackoffBase)
	}
	if c.BackoffBase > longestWait {
		fail("BackoffBase", "must be at most %s, got %s", longestWait, c.BackoffBase)
	}
	if c.BackoffMax > longestWait {
		fail("BackoffMax", "must be at most %s, got %s", longestWait, c.BackoffMax)
	}
	// A heartbeat is sent every fifth of the relay timeout; below a second a
	// busy database could make live relays look dead.
	if c.RelayTimeout > 0 && c.RelayTimeout < time.Second {
		fail("RelayTimeout", "must be at least 1s, got %s", c.RelayTimeout)
	}
	// Bounds of River's, checked here so that a bad value is refused with
	// the others before anything touches the database: a deliver job
	// starts no sooner than River's fetch cooldown after its insert
	// (relay.go), so polling more often finds nothing sooner; and River
	// runs at most river.QueueNumWorkersMax workers on a queue.
	if c.PollInterval < riverFetchCooldown {
		fail("PollInterval", "must be at least %s, got %s", riverFetchCooldown, c.PollInterval)
	}
	if c.DeliverWorkers > river.QueueNumWorkersMax {
		fail("DeliverWorkers", "must be at most %d, got %d", river.QueueNumWorkersMax, c.DeliverWorkers)
	}
	// Each in flight holds a slot allocated up front, and a claim a row per
	// message: a typo of a few zeros must not take the worker's memory.
	if c.DestinationConcurrency > maxCount {
		fail("DestinationConcurrency", "must be at most %d, got %d", maxCount, c.DestinationConcurrency)
	}
	if c.BatchSize > maxCount {
		fail("BatchSize", "must be at most %d, got %d", maxCount, c.BatchSize)
	}
	for name, d := range map[string]time.Duration{"DeliveryTimeout": c.DeliveryTimeout, "PollInterval": c.PollInterval,
		"ClaimTimeout": c.ClaimTimeout} {
		// Summed below; a year is past any sensible value and far from
		// the overflow of a sum.
		if d > longestWait {
			fail(name, "must be at most %s, got %s", longestWait, d)
		}
	}
	// A claim lives as long as its request plus the time to record it; a
	// claim timeout within that would release requests still in flight.
	if least := c.DeliveryTimeout + c.PollInterval + 10*time.Second; c.ClaimTimeout <= least {
		fail("ClaimTimeout", "%s must exceed the delivery timeout %s plus the poll interval %s plus 10s",
			c.ClaimTimeout, c.DeliveryTimeout, c.PollInterval)
	}
	// A partition is named for its start to the minute; and a prune job
	// that fails once (or a leader that dies) must still leave a partition
	// for the writes until the next one.
	if c.PartitionSpan < time.Minute {
		fail("PartitionSpan", "must be at least 1m, got %s", c.PartitionSpan)
	}
	if c.PartitionsAhead < 2*c.PruneInterval {
		fail("PartitionsAhead", "%s must be at least twice the prune interval %s", c.PartitionsAhead, c.PruneInterval)
	}
	return errors.Join(errs...)
}

// retryDelay is the wait after failed attempt number attempt (1-based)
// before the next: the schedule's entry, or exponential backoff when
// BackoffBase is set, capped by BackoffMax when that is set.
func (c Config) retryDelay(attempt int) time.Duration {
	attempt = max(attempt, 1)
	if c.BackoffBase > 0 {
		d := c.BackoffBase
		for i := 1; i < attempt && d < c.BackoffMax; i++ {
			d *= 2
		}
		d = min(d, c.BackoffMax)
		// Equal jitter: half fixed, half random.
		half := d / 2
		return half + rand.N(half+1)
	}
	d := c.RetrySchedule[min(attempt, len(c.RetrySchedule))-1]
	if c.BackoffMax > 0 {
		d = min(d, c.BackoffMax)
	}
	return jitter(d, 10)
}

// probeBase is the wait before the first probe of a destination that
// started backing off.
const probeBase = 5 * time.Second

// probeDelay is the wait before the next probe of a destination after its
// n-th failed probe (0 when it has just started backing off): 5 seconds,
// doubling, up to ProbeIntervalMax.
func (c Config) probeDelay(n int) time.Duration {
	d := min(probeBase, c.ProbeIntervalMax)
	for i := 0; i < n && d < c.ProbeIntervalMax; i++ {
		d *= 2
	}
	return jitter(min(d, c.ProbeIntervalMax), 10)
}

// jitter returns d varied uniformly by up to ±percent %.
func jitter(d time.Duration, percent int64) time.Duration {
	spread := d * time.Duration(percent) / 100
	if spread <= 0 {
		return d
	}
	return d - spread + rand.N(2*spread+1)
}

// heartbeatInterval is how often a relay heartbeats and looks for dead ones:
// five beats fit in the relay timeout, so a live relay is never one late
// beat away from being declared dead.
func (c Config) heartbeatInterval() time.Duration { return c.RelayTimeout / 5 }
