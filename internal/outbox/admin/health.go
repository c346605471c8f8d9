package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/internal/outbox/internal/outboxdb"
)

// What the ops page asks of the outbox: how each endpoint is doing, what
// the last hour looked like, and requeueing an endpoint's failed messages.
// Every read here is bounded by a window or a partial index, so none of it
// grows with the delivered history kept for the retention period.

// EndpointHealth is an endpoint with what waits for it and how its recent
// attempts went.
type EndpointHealth struct {
	Endpoint
	// Waiting counts its pending and claimed messages; InFlight the claimed
	// ones, being sent now; BackingOff those waiting for a retry on their
	// own schedule; Parked those waiting for an earlier message of their
	// ordering key; Failed those that gave up.
	Waiting    int64 `json:"waiting"`
	InFlight   int64 `json:"in_flight"`
	BackingOff int64 `json:"backing_off"`
	Parked     int64 `json:"parked"`
	Failed     int64 `json:"failed"`
	// NextRetryAt is the earliest retry of a message backing off.
	NextRetryAt *time.Time `json:"next_retry_at,omitempty"`
	// The latest success, error and attempt within the window.
	LastSuccessAt       *time.Time `json:"last_success_at,omitempty"`
	LastErrorAt         *time.Time `json:"last_error_at,omitempty"`
	LastError           string     `json:"last_error,omitempty"`
	LastErrorStatusCode int        `json:"last_error_status_code,omitempty"`
	LastAttemptAt       *time.Time `json:"last_attempt_at,omitempty"`
	LastAttemptOutcome  string     `json:"last_attempt_outcome,omitempty"`
}

// EndpointsHealth returns every endpoint with its state, what waits for it,
// and its attempts within window (the last hour, say).
func (a *Service) EndpointsHealth(ctx context.Context, window time.Duration) ([]EndpointHealth, error) {
	return withBacklog(ctx, a.pool, 0, func(q *outboxdb.Queries, b backlog) ([]EndpointHealth, error) {
		return endpointsHealth(ctx, q, b, window)
	})
}

func endpointsHealth(ctx context.Context, q *outboxdb.Queries, b backlog, window time.Duration) ([]EndpointHealth, error) {
	rows, err := q.OpsEndpointHealth(ctx, window.Seconds())
	if err != nil {
		return nil, fmt.Errorf("reading endpoint health: %w", err)
	}
	waiting := b.byDestination()
	out := make([]EndpointHealth, len(rows))
	for i, r := range rows {
		w := waiting[r.ID]
		h := EndpointHealth{
			Endpoint: toEndpoint(outboxdb.WebhookEndpoint{ID: r.ID, Url: r.Url, EventTypes: r.EventTypes,
				Enabled: r.Enabled, DisabledReason: r.DisabledReason, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, DisabledAt: r.DisabledAt,
				Health: r.Health, HealthReason: r.HealthReason, HealthChangedAt: r.HealthChangedAt,
				ConsecutiveFailures: r.ConsecutiveFailures, BackoffUntil: r.BackoffUntil}),
			Waiting: w.Pending + w.Parked + w.Claimed, InFlight: w.Claimed, BackingOff: w.BackingOff, Parked: w.Parked, Failed: w.Failed,
			NextRetryAt: w.NextRetryAt,
		}
		// Only what happened within the window.
		within := func(t *time.Time) bool { return t != nil && !t.Before(r.Since) }
		if within(r.LastSuccessAt) {
			h.LastSuccessAt = r.LastSuccessAt
		}
		if within(r.LastErrorAt) {
			h.LastErrorAt = r.LastErrorAt
			if r.LastError != nil {
				h.LastError = *r.LastError
			}
			if r.LastErrorStatusCode != nil {
				h.LastErrorStatusCode = int(*r.LastErrorStatusCode)
			}
		}
		if within(r.LastAttemptAt) {
			h.LastAttemptAt = r.LastAttemptAt
			if r.LastAttemptOutcome != nil {
				h.LastAttemptOutcome = *r.LastAttemptOutcome
			}
		}
		out[i] = h
	}
	eps := make([]*Endpoint, len(out))
	for i := range out {
		eps[i] = &out[i].Endpoint
	}
	if err := withDelivery(ctx, q, eps...); err != nil {
		return nil, fmt.Errorf("reading endpoint health: %w", err)
	}
	return out, nil
}

// MinuteActivity is one minute of the outbox's recent history.
type MinuteActivity struct {
	// Minute is the start of the minute.
	Minute time.Time `json:"minute"`
	// Attempts finished in the minute, by what came of them: delivered;
	// retried (a failed attempt that will be tried again: an error, a claim
	// that timed out, a request cut off by a stop, a 410 that paused the
	// endpoint); failed (the message gave up at its attempt cap).
	Delivered int64 `json:"delivered"`
	Retried   int64 `json:"retried"`
	Failed    int64 `json:"failed"`
	// Created counts the messages enqueued in the minute. A minute's count
	// is kept by the process once the minute is a minute over: a message
	// committed later than that is not in it.
	Created int64 `json:"created"`
	// Backlog is the number of pending and claimed messages at the end of the
	// minute (now, for the current one). It is reconstructed from the present
	// backlog, the messages enqueued since and the messages settled since; an
	// operator's requeue of failed messages and a replay's messages are not
	// in that history.
	Backlog int64 `json:"backlog"`
}

// Activity is the outbox's recent history, minute by minute.
type Activity struct {
	// Minutes runs oldest first and ends with the current (partial) minute.
	Minutes []MinuteActivity `json:"minutes"`
	// Deliveries in the last 5 and 60 minutes.
	Delivered5m  int64 `json:"delivered_5m"`
	Delivered60m int64 `json:"delivered_60m"`
}

func activity(ctx context.Context, q *outboxdb.Queries, b backlog, arrived *minuteCache[int64], now time.Time, minutes int) (Activity, error) {
	if minutes < 1 {
		minutes = 60
	}
	first := now.Truncate(time.Minute).Add(-time.Duration(minutes-1) * time.Minute)
	attempts, err := q.OpsAttemptsPerMinute(ctx, first)
	if err != nil {
		return Activity{}, fmt.Errorf("reading outbox activity: %w", err)
	}
	created, err := arrived.perMinute(first, now, func(since time.Time) (map[int64]int64, error) {
		rows, err := q.OpsCreatedPerMinute(ctx, since)
		byMinute := make(map[int64]int64, len(rows))
		for _, r := range rows {
			byMinute[r.Minute.Unix()] = r.Created
		}
		return byMinute, err
	})
	if err != nil {
		return Activity{}, fmt.Errorf("reading outbox activity: %w", err)
	}
	rate, err := q.OpsDeliveryRate(ctx)
	if err != nil {
		return Activity{}, fmt.Errorf("reading outbox activity: %w", err)
	}
	act := Activity{Minutes: make([]MinuteActivity, minutes), Delivered5m: rate.Last5m, Delivered60m: rate.Last60m}
	for i := range act.Minutes {
		act.Minutes[i].Minute = first.Add(time.Duration(i) * time.Minute)
	}
	index := func(t time.Time) (int, bool) {
		i := int(t.Sub(first) / time.Minute)
		return i, t.Compare(first) >= 0 && i < minutes
	}
	settled := make([]int64, minutes)
	for _, r := range attempts {
		i, ok := index(r.Minute)
		if !ok {
			continue
		}
		m := &act.Minutes[i]
		switch r.Outcome {
		case "delivered":
			m.Delivered += r.Attempts
			settled[i] += r.Attempts
		case "retry", "refused", "timeout", "interrupted", "gone":
			m.Retried += r.Attempts
		default: // failed: the message gave up
			m.Failed += r.Attempts
			settled[i] += r.Attempts
		}
	}
	for minute, n := range created {
		if i, ok := index(time.Unix(minute, 0)); ok {
			act.Minutes[i].Created += n
		}
	}
	// Walk back from the present: before a minute's arrivals and settlements,
	// the backlog had that minute's arrivals fewer and its settlements more.
	t := b.totals()
	waiting := t.Pending + t.Claimed
	for i := minutes - 1; i >= 0; i-- {
		act.Minutes[i].Backlog = max(waiting, 0)
		waiting += settled[i] - act.Minutes[i].Created
	}
	return act, nil
}

// minuteCache keeps figures by minute for minutes that are over, so that
// a page load reads only the last minutes' rows, not the whole window's:
// the overview's arrivals (counting is linear in them: 0.7 s for an hour at
// 500 messages a second) and its day of delivery lags (linear in the
// endpoints delivering: 0.6 s for a day of 1,000). A minute's figures no
// longer change once the transactions that wrote in it have committed.
type minuteCache[T any] struct {
	mu sync.Mutex
	// byMinute holds the minutes in [from, to), by their Unix time; a
	// minute with nothing has no entry.
	from, to time.Time
	byMinute map[int64]T
}

// minuteSettle is how long after its end a minute's figures are kept: a
// transaction that writes in it and commits later than that is not in them.
const minuteSettle = time.Minute

// perMinute returns the figures of each minute from first on, by the
// minute's Unix time, reading with read only the minutes from since on
// that it does not hold; read returns each minute it finds whole. The
// database is read outside the lock: a slow read holds up no other page
// load.
func (c *minuteCache[T]) perMinute(first, now time.Time, read func(since time.Time) (map[int64]T, error)) (map[int64]T, error) {
	out := map[int64]T{}
	c.mu.Lock()
	since := first
	if !c.from.After(first) && c.to.After(first) {
		since = c.to
		for m, v := range c.byMinute {
			if m >= first.Unix() {
				out[m] = v
			}
		}
	}
	c.mu.Unlock()

	fresh, err := read(since)
	if err != nil {
		return nil, err
	}
	over := now.Truncate(time.Minute).Add(-minuteSettle)
	for m, v := range fresh {
		out[m] = v
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case since.Equal(first):
		// Read from scratch: what is over starts the cache anew.
		c.from, c.to, c.byMinute = first, first, map[int64]T{}
	case !since.Equal(c.to):
		return out, nil // another load moved the cache meanwhile
	}
	if over.After(c.to) {
		for m, v := range fresh {
			if m < over.Unix() {
				c.byMinute[m] = v
			}
		}
		c.to = over
	}
	for m := range c.byMinute {
		if m < first.Unix() {
			delete(c.byMinute, m)
		}
	}
	if first.After(c.from) {
		c.from = first
	}
	return out, nil
}

// Overview is the outbox at a glance, as the ops page shows it: what waits
// and what failed, counted exactly, and the delivered history estimated,
// never counted, so reading it costs the same whatever the retention holds.
type Overview struct {
	Pending int64 `json:"pending"`
	Claimed int64 `json:"claimed"`
	Failed  int64 `json:"failed"`
	// Parked counts the pending messages that wait for an earlier message
	// of their ordering key (included in Pending).
	Parked                  int64   `json:"parked"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// DeliveredEstimate is about how many delivered messages the retention
	// holds, from PostgreSQL's statistics as of the last VACUUM or ANALYZE
	// (autovacuum keeps it roughly current); -1 before the first.
	DeliveredEstimate int64 `json:"delivered_estimate"`
	// LagHour and LagDay are how late deliveries were over every
	// endpoint, in the last hour and the last day; Latest is the endpoint
	// whose deliveries of the last hour were latest (by their p99), nil
	// when none was delivered.
	LagHour LagStats        `json:"lag_hour"`
	LagDay  LagStats        `json:"lag_day"`
	Latest  *LatestEndpoint `json:"latest,omitempty"`
	// Partitions is how far ahead the tables' partitions are made, and
	// the oldest one kept.
	Partitions Partitions `json:"partitions"`
}

// LatestEndpoint is the endpoint whose deliveries were latest.
type LatestEndpoint struct {
	ID  uuid.UUID `json:"id"`
	Lag LagStats  `json:"lag"`
}

// LagStats sum up how late deliveries were over a window: from each
// delivered message's event (its commit, within its transaction's length)
// to the receiver's 2xx or the broker's ack, its retries' and pauses'
// waits included: the number the product cares about, where request time
// (AttemptStats) is the receiver's.
type LagStats struct {
	Window     time.Duration `json:"window"`
	Deliveries int64         `json:"deliveries"`
	P50MS      float64       `json:"p50_ms"`
	P95MS      float64       `json:"p95_ms"`
	P99MS      float64       `json:"p99_ms"`
}

// lagStats estimates a window's percentiles from its buckets.
func lagStats(window time.Duration, buckets []latencyBucket) LagStats {
	s := LagStats{Window: window, P50MS: percentile(buckets, 0.5), P95MS: percentile(buckets, 0.95), P99MS: percentile(buckets, 0.99)}
	for _, b := range buckets {
		s.Deliveries += b.n
	}
	return s
}

// lagBuckets is an endpoint's lag row's buckets for the hour and the day.
func lagBuckets(lower, le int32, hour int64, hourMin, hourMax float64, day int64, dayMin, dayMax float64) (h, d latencyBucket) {
	return latencyBucket{lower: float64(lower), upper: float64(le), n: hour, min: hourMin, max: hourMax},
		latencyBucket{lower: float64(lower), upper: float64(le), n: day, min: dayMin, max: dayMax}
}

func overview(ctx context.Context, q *outboxdb.Queries, b backlog, lags *minuteCache[[]latencyBucket], now time.Time) (Overview, error) {
	delivered, err := q.OpsDeliveredEstimate(ctx)
	if err != nil {
		return Overview{}, fmt.Errorf("reading outbox overview: %w", err)
	}
	est := int64(-1)
	if delivered >= 0 {
		est = int64(math.Round(delivered))
	}
	t := b.totals()
	o := Overview{Pending: t.Pending, Claimed: t.Claimed, Failed: t.Failed, Parked: t.Parked,
		OldestPendingAgeSeconds: t.OldestPendingAgeSeconds, DeliveredEstimate: est}
	if o.Partitions, err = readPartitions(ctx, q); err != nil {
		return Overview{}, err
	}
	rows, err := q.OpsDeliveryLagByEndpoint(ctx)
	if err != nil {
		return Overview{}, fmt.Errorf("reading delivery lags: %w", err)
	}
	var hour []latencyBucket
	byEndpoint := map[uuid.UUID][]latencyBucket{}
	for _, r := range rows {
		b := latencyBucket{lower: float64(r.LowerMs), upper: float64(r.LeMs), n: r.Deliveries, min: r.MinMs, max: r.MaxMs}
		hour = append(hour, b)
		byEndpoint[r.Destination] = append(byEndpoint[r.Destination], b)
	}
	for id, bs := range byEndpoint {
		if s := lagStats(time.Hour, bs); s.Deliveries > 0 && (o.Latest == nil || s.P99MS > o.Latest.Lag.P99MS) {
			o.Latest = &LatestEndpoint{ID: id, Lag: s}
		}
	}
	// The day: its minutes that are over are kept (lags), so a load reads
	// the last few.
	first := now.Truncate(time.Minute).Add(-(24*time.Hour - time.Minute))
	minutes, err := lags.perMinute(first, now, func(since time.Time) (map[int64][]latencyBucket, error) {
		rows, err := q.OpsDeliveryLagPerMinute(ctx, since)
		byMinute := map[int64][]latencyBucket{}
		for _, r := range rows {
			byMinute[r.Minute.Unix()] = append(byMinute[r.Minute.Unix()],
				latencyBucket{lower: float64(r.LowerMs), upper: float64(r.LeMs), n: r.Deliveries, min: r.MinMs, max: r.MaxMs})
		}
		return byMinute, err
	})
	if err != nil {
		return Overview{}, fmt.Errorf("reading delivery lags: %w", err)
	}
	var day []latencyBucket
	for _, bs := range minutes {
		day = append(day, bs...)
	}
	o.LagHour, o.LagDay = lagStats(time.Hour, mergeBuckets(hour)), lagStats(24*time.Hour, mergeBuckets(day))
	return o, nil
}

// mergeBuckets adds up the buckets of equal bounds, sorted by them.
func mergeBuckets(bs []latencyBucket) []latencyBucket {
	at := map[float64]int{}
	var out []latencyBucket
	for _, b := range bs {
		if b.n == 0 {
			continue
		}
		i, ok := at[b.upper]
		if !ok {
			at[b.upper] = len(out)
			out = append(out, b)
			continue
		}
		out[i].n += b.n
		out[i].min, out[i].max = min(out[i].min, b.min), max(out[i].max, b.max)
	}
	slices.SortFunc(out, func(a, b latencyBucket) int { return cmp.Compare(a.upper, b.upper) })
	return out
}

// Dashboard is the figures of the ops page's overview: the outbox at a
// glance, the relays, the last minutes' activity and every endpoint.
type Dashboard struct {
	Overview Overview
	Relays   RelayStatus
	// Activity covers the minutes asked of Dashboard.
	Activity Activity
	// Endpoints' attempts are those within the window asked of Dashboard.
	Endpoints []EndpointHealth
}

// Dashboard returns the overview's figures read in one snapshot, so their
// numbers agree with one another, and with one pass over what waits and
// failed where reading them one by one (as Relays and EndpointsHealth do
// for the api) makes one each. With a backlog of millions (an endpoint
// paused for a day) that pass is most of what a page load costs.
func (a *Service) Dashboard(ctx context.Context, now time.Time, minutes int, window time.Duration) (Dashboard, error) {
	return withBacklog(ctx, a.pool, 0, func(q *outboxdb.Queries, b backlog) (d Dashboard, err error) {
		if d.Overview, err = overview(ctx, q, b, &a.lags, now); err != nil {
			return d, err
		}
		if d.Relays, err = a.relays(ctx, q, b); err != nil {
			return d, err
		}
		if d.Activity, err = activity(ctx, q, b, &a.arrivals, now, minutes); err != nil {
			return d, err
		}
		d.Endpoints, err = endpointsHealth(ctx, q, b, window)
		return d, err
	})
}

// withBacklog reads the backlog and builds a T from it and whatever else
// build reads, all in one read-only transaction that sees one snapshot of
// the database. Messages with poisoned attempts or more are counted as
// poisoned; none when it is 0.
func withBacklog[T any](ctx context.Context, pool *pgxpool.Pool, poisoned int32, build func(*outboxdb.Queries, backlog) (T, error)) (T, error) {
	var v T
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			q := outboxdb.New(tx)
			b, err := readBacklog(ctx, q, poisoned)
			if err != nil {
				return err
			}
			v, err = build(q, b)
			return err
		})
	return v, err
}

// backlog is what waits or failed, per destination, as OpsBacklog reads it
// in one pass: every count and age of the ops page and the metrics is a sum
// or a pick of it.
type backlog []outboxdb.OpsBacklogRow

func readBacklog(ctx context.Context, q *outboxdb.Queries, poisoned int32) (backlog, error) {
	rows, err := q.OpsBacklog(ctx, poisoned)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox backlog: %w", err)
	}
	return rows, nil
}

func (b backlog) byDestination() map[uuid.UUID]outboxdb.OpsBacklogRow {
	m := make(map[uuid.UUID]outboxdb.OpsBacklogRow, len(b))
	for _, r := range b {
		m[r.Destination] = r
	}
	return m
}

// backlogTotals sums a backlog over its destinations. Pending includes the
// parked messages; Due, Scheduled and Paused do not, nor the messages of a
// deleted endpoint not discarded yet.
type backlogTotals struct {
	Pending, Parked, Claimed, Failed int64
	OldestPendingAgeSeconds          float64
	Due, Scheduled, Paused           int64
	OldestDueSeconds                 float64
}

func (b backlog) totals() backlogTotals {
	var t backlogTotals
	for _, r := range b {
		t.Pending += r.Pending + r.Parked
		t.Parked += r.Parked
		t.Claimed += r.Claimed
		t.Failed += r.Failed
		t.OldestPendingAgeSeconds = max(t.OldestPendingAgeSeconds, r.OldestPendingAgeSeconds)
		t.Due += r.Due
		t.Scheduled += r.Scheduled
		t.Paused += r.Paused
		t.OldestDueSeconds = max(t.OldestDueSeconds, r.OldestDueSeconds)
	}
	return t
}

// RetryFailedForEndpoint requeues every failed message of one endpoint
// (failed → pending, due now, with a fresh attempt budget) and returns how
// many it requeued. An endpoint that does not exist and has no failed
// messages is ErrNotFound.
func (a *Service) RetryFailedForEndpoint(ctx context.Context, endpointID uuid.UUID) (int, error) {
	q := outboxdb.New(a.pool)
	ids, err := q.OpsRetryFailedForDestination(ctx, endpointID)
	if err != nil {
		return 0, fmt.Errorf("retrying failed messages: %w", err)
	}
	if len(ids) == 0 {
		if _, err := q.EndpointGet(ctx, endpointID); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return 0, fmt.Errorf("retrying failed messages: %w", ErrNotFound)
			}
			return 0, fmt.Errorf("retrying failed messages: %w", err)
		}
	}
	a.logger.InfoContext(ctx, "failed messages requeued", slog.String("endpoint_id", endpointID.String()),
		slog.Int("requeued", len(ids)))
	return len(ids), nil
}

// EndpointHealth returns one endpoint as EndpointsHealth does.
func (a *Service) EndpointHealth(ctx context.Context, id uuid.UUID, window time.Duration) (EndpointHealth, error) {
	eps, err := a.EndpointsHealth(ctx, window)
	if err != nil {
		return EndpointHealth{}, err
	}
	return endpointOf(eps, id)
}

// EndpointStatus returns one endpoint as EndpointHealth does and the relays
// as Relays does, read in one snapshot with one pass over the backlog: an
// endpoint's page shows both (a healthy endpoint gets nothing while the
// relay is down or stalled).
func (a *Service) EndpointStatus(ctx context.Context, id uuid.UUID, window time.Duration) (EndpointHealth, RelayStatus, error) {
	type status struct {
		ep     EndpointHealth
		relays RelayStatus
	}
	s, err := withBacklog(ctx, a.pool, 0, func(q *outboxdb.Queries, b backlog) (s status, err error) {
		eps, err := endpointsHealth(ctx, q, b, window)
		if err != nil {
			return s, err
		}
		if s.ep, err = endpointOf(eps, id); err != nil {
			return s, err
		}
		s.relays, err = a.relays(ctx, q, b)
		return s, err
	})
	return s.ep, s.relays, err
}

// endpointOf picks endpoint id out of eps.
func endpointOf(eps []EndpointHealth, id uuid.UUID) (EndpointHealth, error) {
	for _, e := range eps {
		if e.ID == id {
			return e, nil
		}
	}
	return EndpointHealth{}, fmt.Errorf("reading endpoint health: %w", ErrNotFound)
}

// AttemptStats sum up an endpoint's attempts over a window.
type AttemptStats struct {
	// Window is how far back it looks.
	Window    time.Duration `json:"window"`
	Attempts  int64         `json:"attempts"`
	Delivered int64         `json:"delivered"`
	// SuccessRate is Delivered / Attempts (0 with no attempts).
	SuccessRate float64 `json:"success_rate"`
	// Request time of the delivered attempts, in milliseconds.
	P50MS float64 `json:"p50_ms"`
	P95MS float64 `json:"p95_ms"`
	P99MS float64 `json:"p99_ms"`
	// Lag is how late the window's deliveries were, from their events.
	Lag LagStats `json:"lag"`
}

// EndpointAttemptStats returns an endpoint's success rate, request time and
// delivery lag (from each event to its delivery) over the last hour and the
// last day (by whole minutes: the
// current one and the 59 or 1,439 before it). They are read from the
// attempts summed by minute as they are recorded, so the read costs the
// same at any delivery rate; the percentiles are estimated from request-time
// buckets, kept between the fastest and slowest request of the bucket.
func (a *Service) EndpointAttemptStats(ctx context.Context, id uuid.UUID) (hour, day AttemptStats, err error) {
	rows, err := outboxdb.New(a.pool).OpsEndpointAttemptStats(ctx, id)
	if err != nil {
		return AttemptStats{}, AttemptStats{}, fmt.Errorf("reading endpoint attempt stats: %w", err)
	}
	var hourBuckets, dayBuckets []latencyBucket
	for _, r := range rows {
		hour.Attempts += r.HourAttempts
		day.Attempts += r.DayAttempts
		if !r.Delivered {
			continue
		}
		hour.Delivered += r.HourAttempts
		day.Delivered += r.DayAttempts
		hourBuckets = append(hourBuckets, latencyBucket{lower: float64(r.LowerMs), upper: float64(r.LeMs),
			n: r.HourAttempts, min: r.HourMinMs, max: r.HourMaxMs})
		dayBuckets = append(dayBuckets, latencyBucket{lower: float64(r.LowerMs), upper: float64(r.LeMs),
			n: r.DayAttempts, min: r.DayMinMs, max: r.DayMaxMs})
	}
	hour, day = attemptStats(time.Hour, hour.Attempts, hour.Delivered, hourBuckets),
		attemptStats(24*time.Hour, day.Attempts, day.Delivered, dayBuckets)
	lags, err := outboxdb.New(a.pool).OpsEndpointDeliveryLag(ctx, id)
	if err != nil {
		return AttemptStats{}, AttemptStats{}, fmt.Errorf("reading endpoint delivery lags: %w", err)
	}
	var hourLag, dayLag []latencyBucket
	for _, r := range lags {
		h, d := lagBuckets(r.LowerMs, r.LeMs, r.HourDeliveries, r.HourMinMs, r.HourMaxMs, r.DayDeliveries, r.DayMinMs, r.DayMaxMs)
		hourLag, dayLag = append(hourLag, h), append(dayLag, d)
	}
	hour.Lag, day.Lag = lagStats(time.Hour, hourLag), lagStats(24*time.Hour, dayLag)
	return hour, day, nil
}

func attemptStats(window time.Duration, attempts, delivered int64, buckets []latencyBucket) AttemptStats {
	s := AttemptStats{Window: window, Attempts: attempts, Delivered: delivered,
		P50MS: percentile(buckets, 0.5), P95MS: percentile(buckets, 0.95), P99MS: percentile(buckets, 0.99)}
	if attempts > 0 {
		s.SuccessRate = float64(delivered) / float64(attempts)
	}
	return s
}

// latencyBucket is how many requests (n) took at least lower and less than
// upper milliseconds, the fastest of them min and the slowest max.
type latencyBucket struct {
	lower, upper float64
	n            int64
	min, max     float64
}

// percentile estimates the q-quantile of the requests in buckets (sorted by
// their bounds), 0 without any: it finds the bucket holding the q-th
// request and interpolates linearly within it, as Prometheus'
// histogram_quantile does, between the bucket's fastest and slowest request
// rather than its bounds, which makes it exact when they are equal.
func percentile(buckets []latencyBucket, q float64) float64 {
	var total int64
	for _, b := range buckets {
		total += b.n
	}
	if total == 0 {
		return 0
	}
	rank, seen := q*float64(total), 0.0
	for _, b := range buckets {
		if b.n == 0 {
			continue
		}
		if seen+float64(b.n) < rank {
			seen += float64(b.n)
			continue
		}
		lo, hi := max(b.lower, b.min), min(b.upper, b.max)
		if hi <= lo {
			return lo
		}
		return lo + (hi-lo)*(rank-seen)/float64(b.n)
	}
	return buckets[len(buckets)-1].max
}

// EndpointAttempt is one attempt of one of an endpoint's messages.
type EndpointAttempt struct {
	Attempt
	MessageID uuid.UUID `json:"message_id"`
	EventID   uuid.UUID `json:"event_id"`
	Type      string    `json:"type"`
}

// EndpointAttempts returns an endpoint's latest attempts of the last day,
// newest first, at most limit of them.
func (a *Service) EndpointAttempts(ctx context.Context, id uuid.UUID, limit int) ([]EndpointAttempt, error) {
	rows, err := outboxdb.New(a.pool).OpsEndpointRecentAttempts(ctx, id, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("listing endpoint attempts: %w", err)
	}
	out := make([]EndpointAttempt, len(rows))
	for i, r := range rows {
		out[i] = EndpointAttempt{MessageID: r.MessageID, EventID: r.EventID, Type: r.Type,
			Attempt: toAttempt(r.Attempt, r.Outcome, r.StartedAt, r.FinishedAt, r.StatusCode, r.Error)}
	}
	return out, nil
}

// DiscardWaiting gives up on every message waiting for an endpoint that
// stays registered: its pending messages, parked ones too, are settled as
// discarded and never sent (a replay can send their events again). Messages
// in flight finish; failed ones still wait for a retry or a skip. It returns
// how many it discarded, and whether it got to the end. A day's backlog is
// millions of rows: they are settled in batches of discardBatch, each its
// own transaction, so the relay's claims and the vacuum never wait on one
// long one; it stops after the batch during which budget ran out (0: no
// limit), so a caller with a deadline (a request) can say how far it got
// and call again. If ctx ends midway, what was discarded stays discarded.
func (a *Service) DiscardWaiting(ctx context.Context, id uuid.UUID, budget time.Duration) (discarded int64, finished bool, err error) {
	if _, err := a.Endpoint(ctx, id); err != nil {
		return 0, false, err
	}
	start := time.Now()
	q := outboxdb.New(a.pool)
	for {
		n, err := q.OpsDiscardWaiting(ctx, "discarded by an operator", id, discardBatch)
		discarded += n
		if err != nil {
			a.logger.InfoContext(ctx, "waiting messages discarded", slog.String("endpoint_id", id.String()),
				slog.Int64("discarded", discarded), slog.Bool("finished", false))
			return discarded, false, fmt.Errorf("discarding waiting messages: %w", err)
		}
		// Until a batch finds nothing: a message claimed while a batch ran
		// is left to its claim, so a short batch is not yet the end.
		if n == 0 {
			break
		}
		if budget > 0 && time.Since(start) >= budget {
			a.logger.InfoContext(ctx, "waiting messages discarded", slog.String("endpoint_id", id.String()),
				slog.Int64("discarded", discarded), slog.Bool("finished", false))
			return discarded, false, nil
		}
	}
	a.logger.InfoContext(ctx, "waiting messages discarded", slog.String("endpoint_id", id.String()), slog.Int64("discarded", discarded))
	return discarded, true, nil
}
