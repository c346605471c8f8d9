package ops

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/outboxkit/orders/internal/outbox/admin"
	"github.com/outboxkit/orders/internal/outbox/destination"
)

// One endpoint's story, and what an operator can do to it: create, edit,
// rotate its secret, discard what waits for it, delete it. Pausing,
// resuming, retrying its failed messages and replaying are in pages.go and
// replay.go; this page offers them too.

// rotationOverlap is how long the relay signs with the previous secret too,
// after a rotation from the page: a day for the receiver to switch.
const rotationOverlap = 24 * time.Hour

// attemptsShown is how many recent attempts the endpoint page lists.
const attemptsShown = 50

type endpointPage struct {
	Layout
	EP admin.EndpointHealth
	// Relay says whether anyone delivers: a healthy endpoint gets nothing
	// while the relay is down or stalled.
	Relay     admin.RelayStatus
	Hour, Day admin.AttemptStats
	Attempts  []admin.EndpointAttempt
	Replay    replayForm
	// Self is the page's path, where its actions return.
	Self string
}

func (h *Handler) handleEndpoint(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id, err := pathID(r)
	if err != nil {
		h.renderError(w, r, http.StatusNotFound, "Not found", "There is no endpoint with that id.")
		return
	}
	ep, relay, err := h.admin.EndpointStatus(ctx, id, Window)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	p := endpointPage{Layout: h.layout(r, "Endpoint "+ep.URL), EP: ep, Relay: relay, Self: Prefix + "/endpoints/" + id.String()}
	if p.Hour, p.Day, err = h.admin.EndpointAttemptStats(ctx, id); err != nil {
		h.actionError(w, r, err)
		return
	}
	if p.Attempts, err = h.admin.EndpointAttempts(ctx, id, attemptsShown); err != nil {
		h.actionError(w, r, err)
		return
	}
	p.Replay = h.newReplayForm(r, ep.Endpoint, p.Self)
	h.render(w, r, http.StatusOK, "endpoint", p)
}

// endpointForm is the create and edit form.
type endpointForm struct {
	Layout
	// Endpoint is nil when creating.
	Endpoint   *admin.Endpoint
	URL        string
	EventTypes string
	Error      string
	// NewID, when creating, is the id the endpoint will have, chosen when
	// the form is shown: submitted twice (a double click), the form
	// creates one endpoint, and the second answer shows its secret too.
	// NewIDSig proves the id was issued by this page to this session for a
	// new endpoint: without it, a session could post the id of an existing
	// endpoint, with its URL and types, and be shown its secret.
	NewID    string
	NewIDSig string
}

// eventTypes reads the form's event types: separated by commas, spaces or
// lines.
func eventTypes(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' })
}

// postedForm reads the create or edit form (ep nil when creating).
func (h *Handler) postedForm(r *http.Request, title string, ep *admin.Endpoint) endpointForm {
	f := endpointForm{Layout: h.layout(r, title), Endpoint: ep, URL: strings.TrimSpace(r.PostForm.Get("url")),
		EventTypes: r.PostForm.Get("event_types")}
	if ep == nil {
		// A form from before these fields, altered, or not issued to this
		// session gets an id of its own.
		id, err := uuid.Parse(r.PostForm.Get("endpoint_id"))
		if err != nil || id == uuid.Nil || !h.issuedNewID(r, id, r.PostForm.Get("endpoint_id_sig")) {
			id = uuid.New()
		}
		f.NewID, f.NewIDSig = id.String(), h.newIDSig(r, id)
	}
	return f
}

// newIDSig signs id as a new endpoint's id issued to the request's
// session; "" without a browser session (a bearer token renders no form).
func (h *Handler) newIDSig(r *http.Request, id uuid.UUID) string {
	s := sessionFrom(r.Context())
	if s.csrf == "" {
		return ""
	}
	return b64.EncodeToString(h.sign("new endpoint id", s.csrf+"\x00"+id.String()))
}

// issuedNewID reports whether sig is newIDSig's for id in this session.
func (h *Handler) issuedNewID(r *http.Request, id uuid.UUID, sig string) bool {
	want := h.newIDSig(r, id)
	return want != "" && subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// refuseForm shows the form again, as filled in, with why it was refused.
func (h *Handler) refuseForm(w http.ResponseWriter, r *http.Request, f endpointForm, why string) {
	f.Error = why
	h.render(w, r, http.StatusUnprocessableEntity, "endpoint_form", f)
}

// formFailed answers a form whose endpoint was refused or whose action
// failed: the form again with the reason when the input was invalid, the
// error page otherwise.
func (h *Handler) formFailed(w http.ResponseWriter, r *http.Request, f endpointForm, err error) {
	if errors.Is(err, admin.ErrInvalidEndpoint) {
		h.refuseForm(w, r, f, admin.Reason(err))
		return
	}
	if f.Endpoint == nil && errors.Is(err, admin.ErrConflict) {
		// This form was submitted before, and its endpoint changed since or
		// was made a while ago: its secret is not shown again.
		h.renderError(w, r, http.StatusConflict, "Already created",
			"This form created its endpoint already; its secret was shown then, and is not shown again. Find the endpoint on the overview, and rotate its secret if it was lost.")
		return
	}
	h.actionError(w, r, err)
}

func (h *Handler) handleNewEndpointForm(w http.ResponseWriter, r *http.Request) {
	id := uuid.New()
	h.render(w, r, http.StatusOK, "endpoint_form", endpointForm{Layout: h.layout(r, "New endpoint"),
		EventTypes: "order.placed, order.cancelled", NewID: id.String(), NewIDSig: h.newIDSig(r, id)})
}

// secretPage shows a signing secret, once.
type secretPage struct {
	Layout
	Endpoint admin.Endpoint
	Secret   string
	// Rotated: a new secret for an existing endpoint, whose previous one
	// still signs too until Endpoint.PreviousSecretExpiresAt.
	Rotated bool
}

// handleCreateEndpoint registers an endpoint from the form. It needs no
// second step: the form is the confirmation, and nothing is sent until an
// event is committed.
func (h *Handler) handleCreateEndpoint(w http.ResponseWriter, r *http.Request) {
	f := h.postedForm(r, "New endpoint", nil)
	ep, err := h.admin.CreateEndpointOnce(r.Context(), uuid.MustParse(f.NewID), f.URL, eventTypes(f.EventTypes))
	if err != nil {
		h.formFailed(w, r, f, err)
		return
	}
	h.logAction(r, "create_endpoint", slog.String("endpoint_id", ep.ID.String()), slog.String("url", ep.URL))
	h.render(w, r, http.StatusCreated, "secret", secretPage{Layout: h.layout(r, "Endpoint created"), Endpoint: ep, Secret: ep.Secret})
}

func (h *Handler) handleEditEndpointForm(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	h.render(w, r, http.StatusOK, "endpoint_form", endpointForm{Layout: h.layout(r, "Edit endpoint"), Endpoint: &ep,
		URL: ep.URL, EventTypes: strings.Join(ep.EventTypes, ", ")})
}

func (h *Handler) handleEditEndpoint(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	f := h.postedForm(r, "Edit endpoint", &ep)
	types := eventTypes(f.EventTypes)
	change := admin.EndpointChange{URL: &f.URL, EventTypes: types}
	if !confirmed(r) {
		if f.URL == "" || len(types) == 0 {
			h.refuseForm(w, r, f, "Give the endpoint a URL and at least one event type.")
			return
		}
		// Refused now rather than after the confirmation: the question is
		// asked only about a change that can be made.
		if err := h.admin.CheckEndpointChange(r.Context(), change); err != nil {
			h.formFailed(w, r, f, err)
			return
		}
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout: h.layout(r, "Change endpoint?"),
			Question: "Change this endpoint in place? It keeps its id, secret and messages: what already waits goes to the new URL, " +
				"and the new event types apply to events committed from now on. A new URL starts healthy, and is tried at once.",
			Details: []fact{{"URL now", ep.URL}, {"URL after", f.URL},
				{"Event types now", strings.Join(ep.EventTypes, ", ")}, {"Event types after", strings.Join(types, ", ")}},
			Action: r.URL.Path, Return: Prefix + "/endpoints/" + ep.ID.String(), Button: "Change endpoint",
			Hidden: []fact{{"url", f.URL}, {"event_types", f.EventTypes}},
		})
		return
	}
	updated, err := h.admin.UpdateEndpoint(r.Context(), ep.ID, change)
	if err != nil {
		h.formFailed(w, r, f, err)
		return
	}
	h.logAction(r, "update_endpoint", slog.String("endpoint_id", ep.ID.String()), slog.String("url", updated.URL),
		slog.String("previous_url", ep.URL), slog.Any("event_types", updated.EventTypes))
	done(w, r, "updated")
}

func (h *Handler) handleRotateSecret(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	if until := ep.PreviousSecretExpiresAt; !confirmed(r) && until != nil && until.After(time.Now()) {
		// Refused by the admin service too: said before the
		// confirmation, with until when.
		h.renderError(w, r, http.StatusConflict, "Rotation in progress",
			"This endpoint's secret was rotated recently: its previous secret still signs until "+stamp(until)+
				". The relay signs with two secrets at most, so a rotation now would drop that one while receivers may still use it. "+
				"Rotate again after that time.")
		return
	}
	if !confirmed(r) {
		question := "Give this endpoint a new signing secret? The new one is shown once, on the next page. " +
			"For the next " + strconv.FormatFloat(rotationOverlap.Hours(), 'f', -1, 64) + " hours (until about " + stamp(time.Now().Add(rotationOverlap)) +
			") the relay signs every delivery with both the new and the previous secret, so the receiver can switch without rejecting one."
		if ep.Kind != destination.KindWebhook {
			question = "This is a broker destination: its messages are not signed, so a new secret changes nothing it receives. Rotate it anyway?"
		}
		// The rotation it confirms: a second submission of this page finds
		// the secret rotated since, and rotates nothing.
		seen := ""
		if ep.PreviousSecretExpiresAt != nil {
			seen = ep.PreviousSecretExpiresAt.Format(time.RFC3339Nano)
		}
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout: h.layout(r, "Rotate signing secret?"), Question: question,
			Details: []fact{{"Endpoint", ep.URL}}, Action: r.URL.Path, Return: returnPath(r), Button: "Rotate secret", Danger: true,
			Hidden: []fact{{"seen_rotation", seen}},
		})
		return
	}
	var rotated admin.Endpoint
	var err error
	if seen, ok := r.PostForm["seen_rotation"]; ok {
		// From the confirmation page: rotate only the secret it showed.
		ep.PreviousSecretExpiresAt = nil
		if seen[0] != "" {
			at, perr := time.Parse(time.RFC3339Nano, seen[0])
			if perr != nil {
				h.renderError(w, r, http.StatusBadRequest, "Cannot rotate", "The confirmation's form is damaged: open the endpoint page again.")
				return
			}
			ep.PreviousSecretExpiresAt = &at
		}
		rotated, err = h.admin.RotateSecretAsSeen(r.Context(), ep, rotationOverlap)
	} else {
		rotated, err = h.admin.RotateSecret(r.Context(), ep.ID, rotationOverlap)
	}
	if errors.Is(err, admin.ErrConflict) {
		h.renderError(w, r, http.StatusConflict, "Already rotated",
			"The secret was rotated since this confirmation was shown (was it submitted twice?), so nothing was rotated now: "+
				"the new secret is the one shown after the first submission. Open the endpoint page to rotate again.")
		return
	}
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	h.logAction(r, "rotate_secret", slog.String("endpoint_id", ep.ID.String()), slog.Duration("overlap", rotationOverlap))
	h.render(w, r, http.StatusOK, "secret", secretPage{Layout: h.layout(r, "Secret rotated"), Endpoint: rotated,
		Secret: rotated.Secret, Rotated: true})
}

func (h *Handler) handleDiscardWaiting(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	if !confirmed(r) {
		health, err := h.admin.EndpointHealth(r.Context(), ep.ID, Window)
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		// What it would discard: messages being sent now finish as they will.
		pending := strconv.FormatInt(health.Waiting-health.InFlight, 10)
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout: h.layout(r, "Discard waiting messages?"),
			Question: fmt.Sprintf("Discard the %s waiting for this endpoint? They are settled as discarded and never sent "+
				"(a replay can send their events again). Messages being sent right now finish; failed ones stay for a retry or a skip. "+
				"This cannot be undone.", plural(pending, "message", "messages")),
			Details: []fact{{"Endpoint", ep.URL}, {"Waiting", pending},
				{"Parked behind their key (among them)", strconv.FormatInt(health.Parked, 10)},
				{"Being sent now (not discarded)", strconv.FormatInt(health.InFlight, 10)}},
			Action: r.URL.Path, Return: returnPath(r), Button: "Discard waiting messages", Danger: true,
		})
		return
	}
	// A day's backlog can take longer than a request may (its batches are
	// committed one by one): batches for the replay's budget, then the
	// question again, with what is done so far.
	n, finished, err := h.admin.DiscardWaiting(r.Context(), ep.ID, h.replayFor)
	// The requests before this one of the same discard, if it continues.
	before, _ := strconv.ParseInt(r.PostForm.Get("discarded"), 10, 64)
	total := max(before, 0) + n
	if err == nil && !finished {
		h.logAction(r, "discard_waiting", slog.String("endpoint_id", ep.ID.String()), slog.Int64("discarded", n), slog.Bool("finished", false))
		so := strconv.FormatInt(total, 10)
		// What still waits, as the database says now: the last batch may
		// have settled everything (only a batch that finds nothing ends the
		// discard), and the page should not say more wait then.
		health, herr := h.admin.EndpointHealth(r.Context(), ep.ID, Window)
		if herr != nil {
			h.actionError(w, r, herr)
			return
		}
		left := health.Waiting - health.InFlight
		still := "none wait any more. Continue to finish it."
		if left > 0 {
			still = plural(strconv.FormatInt(left, 10), "message still waits", "messages still wait") + ". Continue discarding?"
		}
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout: h.layout(r, "Discard not finished"),
			Question: fmt.Sprintf("The discard has settled %s so far; %s",
				plural(so, "message", "messages"), still),
			Details: []fact{{"Endpoint", ep.URL}, {"Discarded so far", so}, {"Still waiting", strconv.FormatInt(left, 10)}},
			Action:  r.URL.Path, Return: returnPath(r), Hidden: []fact{{"discarded", so}},
			Button: "Continue discarding", Cancel: "Stop here", Danger: true,
		})
		return
	}
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	h.logAction(r, "discard_waiting", slog.String("endpoint_id", ep.ID.String()), slog.Int64("discarded", n))
	done(w, r, "discarded", int(total))
}

func (h *Handler) handleDeleteEndpoint(w http.ResponseWriter, r *http.Request) {
	ep, ok := h.endpointFor(w, r)
	if !ok {
		return
	}
	if !confirmed(r) {
		h.render(w, r, http.StatusOK, "confirm", confirmPage{
			Layout: h.layout(r, "Delete endpoint?"),
			Question: "Delete this endpoint for good? Nothing more is sent to it: every message not yet delivered to it is discarded " +
				"at once, and events committed from now on are not written for it. Its delivered history stays for the retention period. " +
				"To stop deliveries for a while instead, pause it. This cannot be undone.",
			Details: []fact{{"Endpoint", ep.URL}, {"Events", strings.Join(ep.EventTypes, ", ")}},
			Action:  r.URL.Path, Return: Prefix + "/endpoints/" + ep.ID.String(), Button: "Delete endpoint", Danger: true,
		})
		return
	}
	n, err := h.admin.DeleteEndpoint(r.Context(), ep.ID)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	h.logAction(r, "delete_endpoint", slog.String("endpoint_id", ep.ID.String()), slog.String("url", ep.URL), slog.Int64("discarded", n))
	r.PostForm.Set("return", Prefix)
	done(w, r, "deleted", int(n))
}
