package ops_test

import (
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// lagSample is count deliveries of one endpoint, minutesAgo minutes ago,
// each ms milliseconds after its event.
type lagSample struct {
	endpoint   uuid.UUID
	minutesAgo int
	ms         float64
	count      int
}

// The commit-to-delivery figures of the endpoint page and the overview are
// the table's (outbox_delivery_lag_minutes, as the relay writes it): every
// delivery of a bucket here is equally late, so each percentile is exactly
// the lag of the delivery at its rank, which the test finds by sorting the
// deliveries themselves; the hour leaves out what is older, and the
// overview names the endpoint whose last hour's p99 is the latest.
func TestCommitToDeliveryFiguresAreTheTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	c := e.loggedIn(t)
	quick := e.endpoint(t, "http://127.0.0.1:9/quick", "order.placed")
	late := e.endpoint(t, "http://127.0.0.1:9/late", "order.placed")
	samples := []lagSample{
		{quick.ID, 0, 40, 90},
		{quick.ID, 3, 3_000, 9},
		{quick.ID, 59, 700_000, 1},  // the hour's oldest minute
		{quick.ID, 120, 15_000, 50}, // in the day, not the hour
		{late.ID, 10, 200_000, 5},
		{late.ID, 1500, 1, 7}, // older than a day: in neither
	}
	for _, s := range samples {
		e.exec(t, `INSERT INTO outbox_delivery_lag_minutes (destination, minute, le_ms, deliveries, min_ms, max_ms)
			VALUES ($1, date_trunc('minute', now()) - make_interval(mins => $2), outbox_lag_bucket_ms($3), $4, $3, $3)`,
			s.endpoint, s.minutesAgo, s.ms, s.count)
	}
	// What the table says, computed here from the deliveries: the lag at
	// each percentile's rank among a window's deliveries.
	want := func(keep func(lagSample) bool) (n int, p50, p95, p99 float64) {
		var lags []float64
		for _, s := range samples {
			if keep(s) {
				for range s.count {
					lags = append(lags, s.ms)
				}
			}
		}
		slices.Sort(lags)
		at := func(q float64) float64 { return lags[int(math.Ceil(q*float64(len(lags))))-1] }
		return len(lags), at(0.5), at(0.95), at(0.99)
	}
	hour := func(ep uuid.UUID) func(lagSample) bool {
		return func(s lagSample) bool { return (ep == uuid.Nil || s.endpoint == ep) && s.minutesAgo < 60 }
	}
	day := func(ep uuid.UUID) func(lagSample) bool {
		return func(s lagSample) bool { return (ep == uuid.Nil || s.endpoint == ep) && s.minutesAgo < 1440 }
	}

	res, body := get(t, c, e.srv.URL+"/ops/endpoints/"+quick.ID.String())
	require.Equal(t, http.StatusOK, res.StatusCode)
	for window, keep := range map[string]func(lagSample) bool{"hour": hour(quick.ID), "day": day(quick.ID)} {
		n, p50, p95, p99 := want(keep)
		m := regexp.MustCompile(`<tr data-window="` + window + `" data-deliveries="(\d+)" data-p50-ms="([\d.]+)" data-p95-ms="([\d.]+)" data-p99-ms="([\d.]+)">`).
			FindStringSubmatch(body)
		require.NotNil(t, m, "the endpoint page's %s of commit to delivery", window)
		require.Equal(t, strconv.Itoa(n), m[1], "%s: deliveries", window)
		require.Equal(t, []string{ms(p50), ms(p95), ms(p99)}, m[2:], "%s: p50, p95, p99", window)
	}
	require.Contains(t, body, `<td class="n">15.0 s</td>`, "a day's p95 of 15 s, read in seconds")

	_, body = get(t, c, e.srv.URL+"/ops")
	n, p50, p95, p99 := want(hour(uuid.Nil))
	require.Contains(t, body, fmt.Sprintf(`id="lag-hour-p99" data-ms="%s" data-deliveries="%d"`, ms(p99), n), "every endpoint's last hour")
	require.Contains(t, body, `<span id="lag-hour-p50">`+lagText(p50)+`</span>`)
	require.Contains(t, body, `<span id="lag-hour-p95">`+lagText(p95)+`</span>`)
	_, _, _, p99 = want(day(uuid.Nil))
	require.Contains(t, body, fmt.Sprintf(`id="lag-day-p99" data-ms="%s"`, ms(p99)), "every endpoint's last day")
	_, _, _, quickP99 := want(hour(quick.ID))
	_, _, _, lateP99 := want(hour(late.ID))
	require.Greater(t, lateP99, quickP99, "the test's premise: the late endpoint's p99 is the later")
	require.Contains(t, body, `id="lag-latest" data-endpoint="`+late.ID.String()+`" href="/ops/endpoints/`+late.ID.String()+`">`+late.URL+`</a>`,
		"the overview names the latest endpoint")
}

func ms(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// lagText is how the pages write a lag of v milliseconds under an hour.
func lagText(v float64) string {
	switch {
	case v < 1000:
		return ms(v) + " ms"
	case v < 60_000:
		return ms(v/1000) + " s"
	default:
		return fmt.Sprintf("%dm %02ds", int(v/60_000), int(v/1000)%60)
	}
}
