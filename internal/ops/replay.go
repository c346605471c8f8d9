package ops

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// A replay re-sends an endpoint's past events: a form (on the overview's
// endpoint rows, and on its own page, where a mistake is shown), a
// confirmation that says how many events it will send, then batches run
// within the request for up to the replay budget. A range too large for one
// request ends on a page that offers to continue from the cursor.

// replayForm is the replay form of one endpoint, as entered (or prefilled).
type replayForm struct {
	ID       uuid.UUID
	URL      string
	CSRF     string
	Return   string
	From, To string
	Types    []typeChoice
	Error    string
}

type typeChoice struct {
	Name    string
	Checked bool
}

// localMinute is the layout of a datetime-local input's value.
const localMinute = "2006-01-02T15:04"

// newReplayForm is an endpoint's form prefilled with the last hour, every
// type checked.
func (h *Handler) newReplayForm(r *http.Request, ep admin.Endpoint, ret string) replayForm {
	to := h.now().UTC().Truncate(time.Minute).Add(time.Minute)
	f := replayForm{ID: ep.ID, URL: ep.URL, CSRF: sessionFrom(r.Context()).csrf, Return: ret,
		From: to.Add(-time.Hour).Format(localMinute), To: to.Format(localMinute)}
	for _, t := range ep.EventTypes {
		f.Types = append(f.Types, typeChoice{Name: t, Checked: true})
	}
	return f
}

type replayPage struct {
	Layout
	Endpoint admin.Endpoint
	Form     replayForm
}

func (h *Handler) renderReplayForm(w http.ResponseWriter, r *http.Request, status int, ep admin.Endpoint, f replayForm) {
	h.render(w, r, status, "replay", replayPage{Layout: h.layout(r, "Replay events"), Endpoint: ep, Form: f})
}

// handleReplayForm shows one endpoint's replay form on a page of its own.
func (h *Handler) handleReplayForm(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	h.renderReplayForm(w, r, http.StatusOK, ep, h.newReplayForm(r, ep, Prefix))
}

// replayInput is a replay form's input, checked.
type replayInput struct {
	From, To time.Time
	// Types are the chosen event types; all the endpoint's when every one
	// of them is chosen.
	Types []string
	// After is the cursor of a replay being continued.
	After *uuid.UUID
	// Replayed and Skipped are what earlier requests of the same replay
	// did, for the final notice.
	Replayed, Skipped int
}

func (in replayInput) replay() admin.Replay {
	return admin.Replay{From: in.From, To: in.To, EventTypes: in.Types, After: in.After}
}

// readReplay reads the replay form: the form as entered (to show it again)
// and, unless it has a mistake (then the form's Error says which), the
// input.
func (h *Handler) readReplay(r *http.Request, ep admin.Endpoint) (replayInput, replayForm) {
	f := replayForm{ID: ep.ID, URL: ep.URL, CSRF: sessionFrom(r.Context()).csrf, Return: returnPath(r),
		From: strings.TrimSpace(r.PostForm.Get("from")), To: strings.TrimSpace(r.PostForm.Get("to"))}
	chosen := r.PostForm["type"]
	for _, t := range ep.EventTypes {
		f.Types = append(f.Types, typeChoice{Name: t, Checked: slices.Contains(chosen, t)})
	}
	var in replayInput
	var ok bool
	if in.From, ok = parseUTC(f.From); !ok {
		f.Error = badTime("From", f.From)
		return in, f
	}
	if in.To, ok = parseUTC(f.To); !ok {
		f.Error = badTime("To", f.To)
		return in, f
	}
	if !in.From.Before(in.To) {
		f.Error = fmt.Sprintf("From (%s) must be before to (%s): the range includes from and stops before to, so it is empty.",
			stamp(in.From), stamp(in.To))
		return in, f
	}
	for _, t := range chosen {
		if !slices.Contains(ep.EventTypes, t) {
			f.Error = fmt.Sprintf("This endpoint does not subscribe to %q: only its own event types can be replayed to it.", t)
			return in, f
		}
	}
	in.Types = slices.Compact(slices.Sorted(slices.Values(chosen)))
	if len(in.Types) == 0 {
		f.Error = "Choose at least one event type to replay."
		return in, f
	}
	if a := r.PostForm.Get("after"); a != "" {
		id, err := uuid.Parse(a)
		if err != nil {
			f.Error = "The replay's cursor (after) is not an event id. Start the replay again."
			return in, f
		}
		in.After = &id
	}
	in.Replayed, in.Skipped = formCount(r, "replayed"), formCount(r, "skipped")
	return in, f
}

func badTime(name, v string) string {
	if v == "" {
		return name + " is missing: enter a date and time (UTC)."
	}
	return fmt.Sprintf("%s is not a date and time: %q. Use the picker, or write it as 2025-03-14T09:30 (UTC).", name, v)
}

// parseUTC reads a datetime-local value (with or without seconds), as UTC;
// or an RFC 3339 time with its own offset, which the confirmation step
// carries.
func parseUTC(s string) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), true
	}
	for _, layout := range []string{localMinute, "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02 15:04:05"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// formCount is a non-negative count carried by the form, 0 if there is none.
func formCount(r *http.Request, name string) int {
	n, err := strconv.Atoi(r.PostForm.Get(name))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// hidden carries a replay's input to the next step.
func (in replayInput) hidden() []fact {
	fs := []fact{{"from", in.From.Format(time.RFC3339Nano)}, {"to", in.To.Format(time.RFC3339Nano)}}
	for _, t := range in.Types {
		fs = append(fs, fact{"type", t})
	}
	if in.After != nil {
		fs = append(fs, fact{"after", in.After.String()},
			fact{"replayed", strconv.Itoa(in.Replayed)}, fact{"skipped", strconv.Itoa(in.Skipped)})
	}
	return fs
}

func (in replayInput) facts(ep admin.Endpoint) []fact {
	types := strings.Join(in.Types, ", ")
	if len(in.Types) == len(ep.EventTypes) {
		types += " (every type it subscribes to)"
	}
	return []fact{{"Endpoint", ep.URL}, {"From", stamp(in.From) + " (included)"}, {"To", stamp(in.To) + " (not included)"},
		{"Event types", types}}
}

// handleReplay is both steps of a replay: without confirm=yes it checks the
// form and asks for confirmation with the number of events; with it, it
// replays batch after batch until the range is done or the budget spent.
func (h *Handler) handleReplay(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	in, form := h.readReplay(r, ep)
	if form.Error != "" {
		h.renderReplayForm(w, r, http.StatusBadRequest, ep, form)
		return
	}
	if !confirmed(r) {
		h.confirmReplay(w, r, ep, in, form)
		return
	}

	ctx := r.Context()
	start := time.Now()
	rp := in.replay()
	var err error
	for {
		var res admin.ReplayResult
		if res, err = h.admin.ReplayEvents(ctx, ep.ID, rp); err != nil {
			break
		}
		in.Replayed += res.Replayed
		in.Skipped += res.Read - res.Replayed
		rp.After = res.Next
		if rp.After == nil || time.Since(start) >= h.replayFor || ctx.Err() != nil {
			break
		}
	}
	in.After = rp.After
	attrs := []slog.Attr{slog.String("endpoint_id", ep.ID.String()), slog.String("url", ep.URL),
		slog.Time("from", in.From), slog.Time("to", in.To), slog.Any("event_types", in.Types),
		slog.Int("replayed", in.Replayed), slog.Int("skipped", in.Skipped), slog.Bool("finished", err == nil && in.After == nil)}
	if in.After != nil {
		attrs = append(attrs, slog.String("after", in.After.String()))
	}
	stopped := fmt.Sprintf("The replay ran for %s and the range is not done yet", humanAge(time.Since(start)))
	if err != nil {
		h.logAction(r, "replay_endpoint", append(attrs, slog.String("error", err.Error()))...)
		if errors.Is(err, admin.ErrInvalidReplay) {
			form.Error = replayRefusal(err)
			h.renderReplayForm(w, r, http.StatusBadRequest, ep, form)
			return
		}
		if in.After == nil {
			// Nothing replayed yet: there is nothing to continue from.
			h.actionError(w, r, err)
			return
		}
		// Batches before the failure are committed: offer to go on from
		// the last one, rather than an error page that loses the cursor.
		stopped = "The replay stopped on an error (it is in the server's log) before the range was done"
	} else {
		h.logAction(r, "replay_endpoint", attrs...)
	}
	if in.After == nil {
		done(w, r, "replayed", in.Replayed, in.Skipped)
		return
	}
	// Not done within the budget, or stopped by an error: offer to go on
	// from the cursor.
	details := append(in.facts(ep),
		fact{"Replayed so far", plural(num(int64(in.Replayed)), "event", "events")},
		fact{"Skipped so far", num(int64(in.Skipped)) + " already waiting for the endpoint"},
		fact{"Stopped after event", in.After.String()})
	h.render(w, r, http.StatusOK, "confirm", confirmPage{
		Layout: h.layout(r, "Replay not finished"),
		Question: fmt.Sprintf("%s: so far it replayed %s (%s already waiting %s skipped). "+
			"Continue from where it stopped? It goes on after the last event it read, so nothing is sent twice.",
			stopped, plural(num(int64(in.Replayed)), "event", "events"), num(int64(in.Skipped)),
			pick(int64(in.Skipped), "was", "were")),
		Details: details, Action: r.URL.Path, Return: returnPath(r), Hidden: in.hidden(),
		Button: "Continue replay", Cancel: "Stop here",
	})
}

// replayRefusal is why a replay was refused, for the form and the error
// page alike.
func replayRefusal(err error) string { return "Not replayed: " + admin.Reason(err) + "." }

// confirmReplay asks before a replay, saying how many events it sends.
func (h *Handler) confirmReplay(w http.ResponseWriter, r *http.Request, ep admin.Endpoint, in replayInput, form replayForm) {
	count, err := h.admin.ReplayCount(r.Context(), ep.ID, in.replay())
	if errors.Is(err, admin.ErrInvalidReplay) {
		form.Error = replayRefusal(err)
		h.renderReplayForm(w, r, http.StatusBadRequest, ep, form)
		return
	}
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	n := count.Events
	if n == 0 && count.Next == nil {
		form.Error = fmt.Sprintf("No event of the chosen types was written from %s to %s: there is nothing to replay. "+
			"Events are kept for the relay's retention (OUTBOX_RETENTION); older ones are gone.", stamp(in.From), stamp(in.To))
		h.renderReplayForm(w, r, http.StatusOK, ep, form)
		return
	}
	events, inRange := plural(num(n), "event", "events"), num(n)
	button := "Replay " + events
	if count.Next != nil {
		// A count reads as much of the range as one replay call scans: a
		// range wider than that is counted as far as the count went.
		sec, nsec := count.Next.Time().UnixTime()
		events = "the chosen types' events (at least " + num(n) + ")"
		inRange = fmt.Sprintf("at least %s: counted up to the events written at %s; the range goes on, and the replay reads it to its end",
			num(n), stamp(time.Unix(sec, nsec)))
		button = "Replay the range"
	}
	details := append(in.facts(ep),
		fact{"Events in the range", inRange},
		fact{"Already waiting", "Events with a message still waiting for this endpoint (pending, in flight or failed) are skipped, not sent twice."},
		fact{"webhook-id", "Each goes under its original event id: a receiver that still remembers it treats it as a duplicate."})
	if !ep.Enabled {
		details = append(details, fact{"Note", "The endpoint is paused: the replayed messages wait until it is resumed."})
	}
	if in.After != nil {
		details = append(details, fact{"Continues after event", in.After.String()})
	}
	h.render(w, r, http.StatusOK, "confirm", confirmPage{
		Layout: h.layout(r, "Replay events?"),
		Question: fmt.Sprintf("Re-send %s to this endpoint? Each becomes a new message, due now, oldest first, "+
			"and the relay delivers them like any other; those already waiting for it are skipped.", events),
		Details: details, Action: r.URL.Path, Return: returnPath(r), Hidden: in.hidden(),
		Button: button,
	})
}
