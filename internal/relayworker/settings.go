package relayworker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/orders/internal/orders"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/relay"
	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/secretbox"
)

// setting is one environment variable of the worker's tuning. This table is
// the only place a setting is declared: it drives parsing, the defaults (read
// from the config the table binds into, filled from outbox's defaults), the
// messages of validation errors, and the table in docs/reference.md (a
// test keeps that in step). Adding a relay knob is a RelayConfig field, its
// default in relay.DefaultConfig, and one row here.
type setting struct {
	env string
	// field is the RelayConfig field it sets, naming it in
	// relay.FieldError; empty for a setting of the worker process itself.
	field string
	doc   string
	// bind points into c: at a time.Duration, an int, a bool, a
	// []time.Duration or a *secretbox.Keyring.
	bind func(c *config) any
}

var settings = []setting{
	{"OUTBOX_POLL_INTERVAL", "PollInterval",
		"how often each worker looks for destinations with due messages, and a running deliver job for new ones",
		func(c *config) any { return &c.relay.PollInterval }},
	{"OUTBOX_DESTINATION_CONCURRENCY", "DestinationConcurrency",
		"the most requests in flight to one destination, across all workers (one deliver job serves a destination at a time); below it, the relay's pace adapts to what the receiver takes",
		func(c *config) any { return &c.relay.DestinationConcurrency }},
	{"OUTBOX_DELIVER_WORKERS", "DeliverWorkers",
		"destinations one worker serves at once (River workers on the deliver queue)",
		func(c *config) any { return &c.relay.DeliverWorkers }},
	{"OUTBOX_BATCH_SIZE", "BatchSize",
		"most messages one claim statement takes (a claim never exceeds the destination's free slots)",
		func(c *config) any { return &c.relay.BatchSize }},
	{"OUTBOX_MAX_ATTEMPTS", "MaxAttempts",
		"attempts before a message is `failed` and waits for a person",
		func(c *config) any { return &c.relay.MaxAttempts }},
	{"OUTBOX_RETRY_SCHEDULE", "RetrySchedule",
		"comma-separated waits before each retry (±10% jitter; the last repeats); the default spans 27.6 h",
		func(c *config) any { return &c.relay.RetrySchedule }},
	{"OUTBOX_BACKOFF_BASE", "BackoffBase",
		"set to use exponential backoff from this base instead of the schedule",
		func(c *config) any { return &c.relay.BackoffBase }},
	{"OUTBOX_BACKOFF_MAX", "BackoffMax",
		"caps every retry wait (default 1h with OUTBOX_BACKOFF_BASE, else no cap)",
		func(c *config) any { return &c.relay.BackoffMax }},
	{"OUTBOX_CIRCUIT_THRESHOLD", "CircuitThreshold",
		"endpoint-wide failures in a row (refused, timeout, 401, 403, 404, 405, 408, 429, 5xx) after which a destination backs off as a whole",
		func(c *config) any { return &c.relay.CircuitThreshold }},
	{"OUTBOX_PROBE_INTERVAL_MAX", "ProbeIntervalMax",
		"longest wait between probes of a destination backing off (the first after 5s, doubling)",
		func(c *config) any { return &c.relay.ProbeIntervalMax }},
	{"OUTBOX_RELAY_TIMEOUT", "RelayTimeout",
		"a worker silent this long (its own setting: workers may differ) is declared dead and its claimed messages are delivered by the others",
		func(c *config) any { return &c.relay.RelayTimeout }},
	{"OUTBOX_CLAIM_TIMEOUT", "ClaimTimeout",
		"last resort: a claim older than its worker's claim timeout is released, whichever worker looks",
		func(c *config) any { return &c.relay.ClaimTimeout }},
	{"OUTBOX_DELIVERY_TIMEOUT", "DeliveryTimeout",
		"one webhook request",
		func(c *config) any { return &c.relay.DeliveryTimeout }},
	{"OUTBOX_RETENTION", "Retention",
		"how long delivered and discarded rows are kept, and events (what a replay can re-send); keep it, plus the retries' 31 hours, within the receivers' inbox retention (`CONSUMER_INBOX_RETENTION`: see [operations.md](operations.md))",
		func(c *config) any { return &c.relay.Retention }},
	{"OUTBOX_FAILED_RETENTION", "FailedRetention",
		"how long `failed` messages wait for a person to retry or skip them, with their attempt history; then the prune job deletes them (their events go once past `OUTBOX_RETENTION` too)",
		func(c *config) any { return &c.relay.FailedRetention }},
	{"OUTBOX_PRUNE_INTERVAL", "PruneInterval",
		"how often the prune job runs",
		func(c *config) any { return &c.relay.PruneInterval }},
	{"OUTBOX_PARTITION_SPAN", "PartitionSpan",
		"the time one partition of `outbox_events`, `outbox_messages` and `outbox_attempts` holds; the prune job drops a partition whole once every row in it is settled and past its retention, so rows are kept up to one span past `OUTBOX_RETENTION` (see [operations.md](operations.md#pruning-and-retention))",
		func(c *config) any { return &c.relay.PartitionSpan }},
	{"OUTBOX_PARTITIONS_AHEAD", "PartitionsAhead",
		"how far ahead the prune job keeps partitions made; an order whose rows find none fails, so this is how long a stopped prune job leaves before writes fail (`outbox_partitions_ahead_seconds` alerts long before)",
		func(c *config) any { return &c.relay.PartitionsAhead }},
	{"OUTBOX_NOTIFY", "Listen",
		"`true`: workers LISTEN and deliver at commit instead of at the next poll; set it on the api too, whose order transactions then NOTIFY (it costs write throughput)",
		func(c *config) any { return &c.relay.Listen }},
	{"OUTBOX_SECRET_KEYS", "SecretKeys",
		"comma-separated `<id>:<base64 of 32 bytes>` keys that encrypt webhook signing secrets at rest: the first encrypts, all decrypt; the api needs the same (docs/operations.md). Unset: secrets are stored in the clear",
		func(c *config) any { return &c.relay.SecretKeys }},
	{"ORDERS_IDEMPOTENCY_TTL", "",
		"how long an `Idempotency-Key` dedupes `POST /orders`; then a job clears it (within `OUTBOX_PRUNE_INTERVAL`) and the same key places a new order",
		func(c *config) any { return &c.idempotencyTTL }},
	{"OUTBOX_ENDPOINT_METRICS", "",
		"`false` leaves out `outbox_endpoint_deliveries_total`, `outbox_endpoint_delivery_duration_seconds` and `outbox_endpoint_delivery_lag_seconds`, whose series grow with the endpoints (about 140 per endpoint; a deleted endpoint's are dropped within about 10 s)",
		func(c *config) any { return &c.endpointMetrics }},
	{"OUTBOX_STALL_THRESHOLD", "",
		"`/readyz` fails when a deliverable message has waited this long and this worker claimed nothing meanwhile",
		func(c *config) any { return &c.stallThreshold }},
	{"WORKER_ALLOWED_HOSTS", "",
		"comma-separated host names `WORKER_ADDR` answers to besides its IP addresses and `localhost` (what scrapers put in `Host`, such as `worker-0.orders.svc`); any other `Host` is answered `421`, as a DNS rebinding's would be",
		func(c *config) any { return &c.allowedHosts }},
	{"WORKER_SHUTDOWN_GRACE", "",
		"on SIGTERM, time for requests in flight to finish before they are cut off (either way outcomes are recorded and the rest released)",
		func(c *config) any { return &c.shutdownGrace }},
}

// retired names settings that are no longer read, and what replaced them.
var retired = map[string]string{
	"OUTBOX_MAX_IN_FLIGHT":       "OUTBOX_DESTINATION_CONCURRENCY × OUTBOX_DELIVER_WORKERS bound the requests in flight",
	"OUTBOX_DELIVER_BATCH":       "deliver jobs now serve one destination each and claim as requests finish",
	"OUTBOX_DELIVER_CONCURRENCY": "use OUTBOX_DESTINATION_CONCURRENCY (requests in flight per destination)",
}

// defaults returns the worker's configuration before the environment.
func defaults() config {
	return config{
		relay:           relay.DefaultConfig(),
		shutdownGrace:   15 * time.Second,
		idempotencyTTL:  orders.DefaultIdempotencyTTL,
		stallThreshold:  admin.DefaultStallThreshold,
		endpointMetrics: true,
		// brokers
		brokers: defaultBrokers,
		// /brokers
	}
}

// allSettings is every setting the worker reads: the table's, then the
// brokers'.
func allSettings() []setting {
	all := slices.Clip(settings)
	// brokers
	all = append(all, brokerSettings...)
	// /brokers
	return all
}

// parseSettings reads every setting from env into c.
func parseSettings(env *process.Env, c *config) {
	for _, s := range allSettings() {
		switch p := s.bind(c).(type) {
		case *time.Duration:
			*p = env.Duration(s.env, *p)
		case *int:
			*p = env.Int(s.env, *p)
		case *[]time.Duration:
			*p = env.Durations(s.env, *p)
		case *bool:
			*p = env.Bool(s.env, *p)
		case *string:
			*p = env.String(s.env, *p)
		case *[]string:
			for v := range strings.SplitSeq(env.String(s.env, ""), ",") {
				if v = strings.TrimSpace(v); v != "" {
					*p = append(*p, v)
				}
			}
		case *process.Hosts:
			*p = env.Hosts(s.env)
		case **secretbox.Keyring:
			keys, err := secretbox.Parse(env.String(s.env, ""))
			if err != nil {
				env.Fail(s.env, err)
			}
			*p = keys
		default:
			panic(fmt.Sprintf("setting %s: unsupported type %T", s.env, p))
		}
	}
}

// validateSettings checks the relay's settings together, naming each
// problem's variable.
func validateSettings(env *process.Env, getenv func(string) string, c config) {
	if getenv("OUTBOX_RETRY_SCHEDULE") != "" && getenv("OUTBOX_BACKOFF_BASE") != "" {
		env.Fail("OUTBOX_BACKOFF_BASE", errors.New("set OUTBOX_RETRY_SCHEDULE or OUTBOX_BACKOFF_BASE, not both"))
	}
	// brokers
	validateBrokers(env, c.brokers)
	// /brokers
	if c.idempotencyTTL <= 0 {
		env.Fail("ORDERS_IDEMPOTENCY_TTL", fmt.Errorf("must be positive, got %s", c.idempotencyTTL))
	}
	err := c.relay.Validate()
	if err == nil {
		return
	}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *relay.FieldError
		if !errors.As(e, &fe) {
			continue
		}
		name := fe.Field
		for _, s := range allSettings() {
			if s.field == fe.Field {
				name = s.env
			}
		}
		env.Fail(name, errors.New(fe.Msg))
	}
}

// settingsTable renders settings as a Markdown table of docs/reference.md,
// with their defaults.
func settingsTable(settings []setting) string {
	d := defaults()
	var b strings.Builder
	b.WriteString("| Variable | Default | Meaning |\n|---|---|---|\n")
	for _, s := range settings {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", s.env, formatDefault(s.bind(&d)), s.doc)
	}
	return b.String()
}

func formatDefault(p any) string {
	switch p := p.(type) {
	case *time.Duration:
		if *p == 0 {
			return "unset"
		}
		return "`" + formatDuration(*p) + "`"
	case *int:
		return fmt.Sprintf("`%d`", *p)
	case *bool:
		return fmt.Sprintf("`%t`", *p)
	case *string:
		if *p == "" {
			return "unset"
		}
		return "`" + *p + "`"
	case *[]string:
		if len(*p) == 0 {
			return "unset"
		}
		return "`" + strings.Join(*p, ",") + "`"
	case *process.Hosts:
		if len(*p) == 0 {
			return "unset"
		}
		return "`" + strings.Join(*p, ",") + "`"
	case **secretbox.Keyring:
		return "unset"
	case *[]time.Duration:
		parts := make([]string, len(*p))
		for i, d := range *p {
			parts[i] = formatDuration(d)
		}
		return "`" + strings.Join(parts, ",") + "`"
	}
	return fmt.Sprint(p)
}

// formatDuration writes a duration as a person would: 5m, not 5m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
