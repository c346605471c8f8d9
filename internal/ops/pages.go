package ops

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err)
	}
	files := http.StripPrefix(Prefix+"/static/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})
}

// pages holds one template set per page, each with the shared layout.
type pages struct {
	byName map[string]*template.Template
}

func mustParsePages() *pages {
	base := template.Must(template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/replay_form.html"))
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range []string{"login", "overview", "message", "confirm", "error", "replay",
		"messages", "search", "endpoint", "endpoint_form", "secret", "event_types"} {
		t := template.Must(base.Clone())
		p.byName[name] = template.Must(t.ParseFS(templateFS, "templates/"+name+".html"))
	}
	return p
}

// Layout is what every page's frame needs.
type Layout struct {
	Title  string
	Authed bool
	CSRF   string
	Notice string
	// Warnings are the server's configuration warnings, for signed-in pages.
	Warnings []string
	Now      time.Time
	Refresh  int
	// Jobs: River UI is mounted, so the menu links to it.
	Jobs bool
}

func (h *Handler) layout(r *http.Request, title string) Layout {
	s := sessionFrom(r.Context())
	l := Layout{Title: title, Authed: s.via != "", CSRF: s.csrf, Now: h.now().UTC(), Notice: notice(r.URL.Query()), Jobs: h.jobs}
	if l.Authed {
		l.Warnings = h.warnings
	}
	return l
}

// render executes a page into a buffer first, so a template error is a clean
// 500 rather than half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := h.pages.byName[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.logger.ErrorContext(r.Context(), "ops page failed to render", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "the page failed to render; the server log has the details", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorPage struct {
	Layout
	Status  int
	Message string
}

func (h *Handler) renderError(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	h.render(w, r, status, "error", errorPage{Layout: h.layout(r, title), Status: status, Message: msg})
}

type loginPage struct {
	Layout
	Error string
	// Next is the page to go to once signed in (empty: the overview).
	Next string
}

func (h *Handler) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="admin"`)
	}
	l := h.layout(r, "Sign in")
	l.Authed = false
	// The page asked for: this one, when a page of the site was refused;
	// the one the login form carries, when it is shown again.
	next := r.URL.Query().Get("next")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == Prefix+"/login":
		next = r.PostForm.Get("next")
	case r.Method == http.MethodGet && r.URL.Path != Prefix+"/login":
		next = r.URL.RequestURI()
	}
	if next = nextPath(next); next == Prefix {
		next = ""
	}
	h.render(w, r, status, "login", loginPage{Layout: l, Error: msg, Next: next})
}

// ---- overview ----------------------------------------------------------

// Window is the span of the overview's chart and endpoint health.
const Window = time.Hour

type overviewPage struct {
	Layout
	Relay        admin.RelayStatus
	Stats        admin.Overview
	OldestAge    string
	Rate5m       string
	Rate60m      string
	Delivered5m  int64
	Delivered60m int64
	Deliveries   chart
	Backlog      chart
	Endpoints    []endpointRow
	Failed       []messageRow
	MoreFailed   bool
	Recent       []messageRow
	// LatestURL is the URL of the endpoint whose deliveries of the last
	// hour were latest (Stats.Latest).
	LatestURL string
}

type messageRow struct {
	admin.Message
	EndpointURL string
}

// endpointRow is an endpoint of the overview, with its replay form.
type endpointRow struct {
	admin.EndpointHealth
	Replay replayForm
}

const failedShown = 50

func (h *Handler) handleOverview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := h.now()
	// Never admin.Stats: it counts the whole delivered history.
	d, err := h.admin.Dashboard(ctx, now, int(Window/time.Minute), Window)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	stats, relay, act, eps := d.Overview, d.Relays, d.Activity, d.Endpoints
	failed, _, err := h.admin.Messages(ctx, admin.MessageFilter{Status: outbox.StatusFailed, Limit: failedShown + 1})
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	recent, _, err := h.admin.Messages(ctx, admin.MessageFilter{Limit: 12})
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	urls := make(map[uuid.UUID]string, len(eps))
	epRows := make([]endpointRow, len(eps))
	for i, e := range eps {
		urls[e.ID] = e.URL
		epRows[i] = endpointRow{EndpointHealth: e, Replay: h.newReplayForm(r, e.Endpoint, Prefix)}
	}
	rows := func(ms []admin.Message) []messageRow {
		out := make([]messageRow, len(ms))
		for i, m := range ms {
			out[i] = messageRow{Message: m, EndpointURL: urls[m.Destination]}
		}
		return out
	}
	p := overviewPage{
		Layout:       h.layout(r, "Outbox"),
		Relay:        relay,
		Stats:        stats,
		OldestAge:    humanAge(time.Duration(stats.OldestPendingAgeSeconds * float64(time.Second))),
		Rate5m:       perMinute(act.Delivered5m, 5),
		Rate60m:      perMinute(act.Delivered60m, 60),
		Delivered5m:  act.Delivered5m,
		Delivered60m: act.Delivered60m,
		Deliveries:   deliveriesChart(act.Minutes),
		Backlog:      backlogChart(act.Minutes),
		Endpoints:    epRows,
		Failed:       rows(failed),
		Recent:       rows(recent),
	}
	if len(p.Failed) > failedShown {
		p.Failed, p.MoreFailed = p.Failed[:failedShown], true
	}
	if stats.Latest != nil {
		p.LatestURL = urls[stats.Latest.ID]
	}
	if v, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && v >= 5 && v <= 3600 {
		p.Refresh = v
	}
	h.render(w, r, http.StatusOK, "overview", p)
}

// ---- message detail ----------------------------------------------------

type messagePage struct {
	Layout
	Msg      admin.MessageDetail
	Endpoint *admin.Endpoint
	Body     string
	Headers  []header
	// Replayed: this delivery was written after its event, by a replay.
	Replayed bool
}

type header struct {
	Name, Value, Note string
}

func (h *Handler) handleMessage(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.renderError(w, r, http.StatusNotFound, "Not found", "There is no message with that id.")
		return
	}
	m, err := h.admin.Message(r.Context(), id)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	p := messagePage{Layout: h.layout(r, "Message "+m.ID.String()), Msg: m, Body: sentBody(m.Message),
		Replayed: !m.CreatedAt.Equal(m.EventCreatedAt)}
	if ep, err := h.admin.Endpoint(r.Context(), m.Destination); err == nil {
		p.Endpoint = &ep
	}
	p.Headers = []header{{"content-type", "application/json", ""}}
	if h.userAgent != "" {
		p.Headers = append(p.Headers, header{"user-agent", h.userAgent, ""})
	}
	p.Headers = append(p.Headers, []header{
		{"webhook-id", m.EventID.String(), "the event id: the same on every attempt and at every endpoint; receivers deduplicate on it"},
		{"webhook-timestamp", "", "Unix seconds, set when each attempt is sent"},
		{"webhook-signature", "v1,…", "HMAC-SHA256 of id.timestamp.body with the endpoint's secret, computed for each attempt"},
	}...)
	h.render(w, r, http.StatusOK, "message", p)
}

// sentBody is the webhook body as the relay sends it, indented.
func sentBody(m admin.Message) string {
	body := m.Body()
	var out bytes.Buffer
	if err := json.Indent(&out, body, "", "  "); err != nil {
		return string(body)
	}
	return out.String()
}

// ---- actions -----------------------------------------------------------

type confirmPage struct {
	Layout
	Question string
	Details  []fact
	Action   string
	Return   string
	Button   string
	Danger   bool
	// Hidden are the form's fields that carry the action's input to the
	// second step (name and value; a name may repeat).
	Hidden []fact
	// Cancel labels the way back; empty means "Cancel".
	Cancel string
}

type fact struct{ Name, Value string }

// confirmed reports whether the form carries the second step's confirmation.
func confirmed(r *http.Request) bool { return r.PostForm.Get("confirm") == "yes" }

// pathID is the {id} of a page's path, in the canonical spelling only (any
// case), as in the API: one address per message or endpoint.
func pathID(r *http.Request) (uuid.UUID, error) {
	raw := r.PathValue("id")
	id, err := uuid.Parse(raw)
	if err == nil && !strings.EqualFold(id.String(), raw) {
		err = fmt.Errorf("id %q is not in the canonical form", raw)
	}
	return id, err
}

func (h *Handler) handleRetryMessage(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.renderError(w, r, http.StatusNotFound, "Not found", "There is no message with that id.")
		return
	}
	if !confirmed(r) {
		m, err := h.admin.Message(r.Context(), id)
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		details := h.messageFacts(r, m)
		if m.OrderingKey != "" && m.Holding > 0 {
			details = append(details, fact{"Note", fmt.Sprintf("It still goes first: the %s of its key behind it %s until it is delivered.",
				plural(strconv.FormatInt(m.Holding, 10), "later message", "later messages"), pick(m.Holding, "waits", "wait"))})
		}
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout:   h.layout(r, "Retry message?"),
			Question: "Send this message again? It goes back to pending with a fresh attempt budget, and the relay delivers it within moments.",
			Details:  details, Action: r.URL.Path, Return: returnPath(r), Button: "Retry message",
		})
		return
	}
	m, err := h.admin.Retry(r.Context(), id)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	h.logAction(r, "retry_message", slog.String("message_id", id.String()), slog.String("endpoint_id", m.Destination.String()))
	done(w, r, "retried", -1)
}

// messageFacts describe a message on a confirmation page.
func (h *Handler) messageFacts(r *http.Request, m admin.MessageDetail) []fact {
	details := []fact{{"Message", m.ID.String()}, {"Event", m.EventID.String()}, {"Type", m.Type}}
	if ep, err := h.admin.Endpoint(r.Context(), m.Destination); err == nil {
		details = append(details, fact{"Endpoint", ep.URL})
	}
	details = append(details, fact{"Ordering key", m.OrderingKey}, fact{"Status", m.Status},
		fact{"Attempts", strconv.Itoa(m.Attempts)}, fact{"Last error", m.LastError})
	return details
}

// handleSkipMessage gives up on a failed message for good: discarded, never
// sent, and the next message of its ordering key is let go.
func (h *Handler) handleSkipMessage(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		h.renderError(w, r, http.StatusNotFound, "Not found", "There is no message with that id.")
		return
	}
	if !confirmed(r) {
		m, err := h.admin.Message(r.Context(), id)
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		if m.Status != outbox.StatusFailed {
			h.actionError(w, r, admin.ErrConflict)
			return
		}
		question := "Skip this message? It is settled as discarded and never sent again: this endpoint does not get the event " +
			"(unless you replay it later). This cannot be undone."
		details := h.messageFacts(r, m)
		switch {
		case m.OrderingKey != "" && m.Holding > 0:
			behind := plural(strconv.FormatInt(m.Holding, 10), "later message", "later messages")
			question += " The " + behind + " of its ordering key waiting behind it " + pick(m.Holding, "is", "are") + " sent next, in order."
			details = append(details, fact{"Waiting behind it", behind + " of its key, let go when it is skipped"})
		case m.OrderingKey != "":
			question += " The next message of its ordering key will not wait for it."
		}
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout: h.layout(r, "Skip message?"), Question: question,
			Details: details, Action: r.URL.Path, Return: returnPath(r), Button: "Skip message", Danger: true,
		})
		return
	}
	m, err := h.admin.Skip(r.Context(), id)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	h.logAction(r, "skip_message", slog.String("message_id", id.String()), slog.String("event_id", m.EventID.String()),
		slog.String("endpoint_id", m.Destination.String()), slog.String("ordering_key", m.OrderingKey))
	done(w, r, "skipped")
}

func (h *Handler) endpointFor(w http.ResponseWriter, r *http.Request) (admin.Endpoint, bool) {
	id, err := pathID(r)
	if err != nil {
		h.renderError(w, r, http.StatusNotFound, "Not found", "There is no endpoint with that id.")
		return admin.Endpoint{}, false
	}
	ep, err := h.admin.Endpoint(r.Context(), id)
	if err != nil {
		h.actionError(w, r, err)
		return admin.Endpoint{}, false
	}
	return ep, true
}

func (h *Handler) handleSetEnabled(enabled bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ep, ok := h.endpointFor(w, r)
		if !ok {
			return
		}
		if !confirmed(r) {
			p := confirmPage{Layout: h.layout(r, "Pause endpoint?"), Action: r.URL.Path, Return: returnPath(r),
				Details: []fact{{"Endpoint", ep.URL}, {"Events", strings.Join(ep.EventTypes, ", ")}}}
			switch {
			case enabled && ep.Enabled:
				p.Title, p.Button = "Probe endpoint now?", "Probe now"
				p.Question = "This endpoint is backing off after repeated failures. Send one message to it now instead of at its next probe? If it gets an answer, deliveries resume."
			case enabled:
				p.Title, p.Button = "Resume endpoint?", "Resume endpoint"
				p.Question = "Resume deliveries to this endpoint? The relay sends what waited for it, oldest first."
			default:
				p.Button, p.Danger = "Pause endpoint", true
				p.Question = "Pause deliveries to this endpoint? Events committed while it is paused are kept and wait, spending no attempts; they are delivered when you resume it."
			}
			h.render(w, r, http.StatusOK, "confirm", p)
			return
		}
		if _, err := h.admin.SetEndpointEnabled(r.Context(), ep.ID, enabled); err != nil {
			h.actionError(w, r, err)
			return
		}
		action, notice := "disable_endpoint", "disabled"
		switch {
		case enabled && ep.Enabled:
			action, notice = "probe_endpoint", "probing"
		case enabled:
			action, notice = "enable_endpoint", "enabled"
		}
		h.logAction(r, action, slog.String("endpoint_id", ep.ID.String()), slog.String("url", ep.URL))
		done(w, r, notice, -1)
	}
}

func (h *Handler) handleRetryEndpoint(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	if !confirmed(r) {
		var failed int64
		if eps, err := h.admin.EndpointsHealth(r.Context(), Window); err == nil {
			for _, e := range eps {
				if e.ID == ep.ID {
					failed = e.Failed
				}
			}
		}
		details := []fact{{"Endpoint", ep.URL}, {"Failed messages", strconv.FormatInt(failed, 10)}}
		if !ep.Enabled {
			details = append(details, fact{"Note", "The endpoint is paused: the retried messages wait until it is resumed."})
		}
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout:   h.layout(r, "Retry all failed messages?"),
			Question: "Send every failed message of this endpoint again? Each goes back to pending with a fresh attempt budget.",
			Details:  details, Action: r.URL.Path, Return: returnPath(r), Button: "Retry all failed",
		})
		return
	}
	n, err := h.admin.RetryFailedForEndpoint(r.Context(), ep.ID)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	h.logAction(r, "retry_failed_for_endpoint", slog.String("endpoint_id", ep.ID.String()), slog.Int("requeued", n))
	done(w, r, "retried_all", n)
}

// ---- formatting ----------------------------------------------------------

// pick is one when n is 1, else many: a verb that agrees with a count.
func pick(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

var funcs = template.FuncMap{
	"age":      func(d time.Duration) string { return humanAge(d) },
	"ago":      ago,
	"stamp":    stamp,
	"datetime": datetime,
	"num":      num,
	"short":    func(id uuid.UUID) string { return tail(id.String()) },
	"truncate": truncate,
	"ms":       func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + " ms" },
	"lag":      lag,
	"lower":    strings.ToLower,
	"slug":     func(s string) string { return strings.ReplaceAll(s, " ", "-") },
	"join":     strings.Join,
	"f":        func(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) },
	"add":      func(a, b float64) float64 { return a + b },
	"sub":      func(a, b float64) float64 { return a - b },
	"mid":      func(a, b float64) float64 { return (a + b) / 2 },
	"plural":   func(n int64, one, many string) string { return plural(num(n), one, many) },
	"seconds":  func(f float64) string { return humanAge(time.Duration(f * float64(time.Second))) },
	"tail":     tail,
	"pct": func(f float64) string {
		return strconv.FormatFloat(math.Floor(f*1000)/10, 'f', -1, 64) + "%"
	},
}

// tail is the end of an id, where UUIDv7 ids differ: their first half is a
// time, shared by everything written in the same millisecond.
func tail(id string) string {
	if len(id) <= 12 {
		return id
	}
	return "…" + id[len(id)-12:]
}

// lag is a delivery's lag of ms milliseconds as a person reads it: to the
// tenth of a millisecond or second up to a minute, as humanAge beyond.
func lag(ms float64) string {
	switch {
	case ms < 1000:
		return strconv.FormatFloat(ms, 'f', 1, 64) + " ms"
	case ms < 60_000:
		return strconv.FormatFloat(ms/1000, 'f', 1, 64) + " s"
	default:
		return humanAge(time.Duration(ms * float64(time.Millisecond)))
	}
}

// humanAge reads like a person would say it: 42s, 3m 12s, 2h 05m, 3d 4h.
func humanAge(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", max(s, 1))
	case s < 3600:
		return fmt.Sprintf("%dm %02ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh %02dm", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%dd %dh", s/86400, s%86400/3600)
	}
}

func perMinute(n int64, minutes int) string {
	v := float64(n) / float64(minutes)
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
	default:
		return num(int64(math.Round(v)))
	}
}

// ago is a relative time for a *time.Time or time.Time ("—" when unset).
func ago(now time.Time, v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x == nil {
			return "—"
		}
		t = *x
	}
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + humanAge(-d)
	}
	if d < time.Second {
		return "just now"
	}
	return humanAge(d) + " ago"
}

// stamp is an absolute UTC time.
func stamp(v any) string {
	switch x := v.(type) {
	case time.Time:
		if x.IsZero() {
			return ""
		}
		return x.UTC().Format("2006-01-02 15:04:05 UTC")
	case *time.Time:
		if x == nil {
			return ""
		}
		return x.UTC().Format("2006-01-02 15:04:05 UTC")
	}
	return ""
}

// datetime is a time as a machine reads it (a <time> element's datetime,
// a test's comparison with the database): RFC 3339 in UTC, to the
// microsecond PostgreSQL keeps.
func datetime(t *time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// num groups thousands: 12,345.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
