package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/outbox/destination"
)

// Handler returns the admin HTTP routes: webhook endpoints (with replay),
// the outbox's stats, messages, retry and skip, and the event catalog. The caller puts authentication in front.
func (a *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhook-endpoints", a.handleCreateEndpoint)
	mux.HandleFunc("GET /webhook-endpoints", a.handleListEndpoints)
	mux.HandleFunc("GET /webhook-endpoints/{id}", a.handleGetEndpoint)
	mux.HandleFunc("PATCH /webhook-endpoints/{id}", a.handleUpdateEndpoint)
	mux.HandleFunc("DELETE /webhook-endpoints/{id}", a.handleDeleteEndpoint)
	mux.HandleFunc("POST /webhook-endpoints/{id}/enable", a.handleSetEnabled(true))
	mux.HandleFunc("POST /webhook-endpoints/{id}/disable", a.handleSetEnabled(false))
	mux.HandleFunc("POST /webhook-endpoints/{id}/rotate-secret", a.handleRotateSecret)
	mux.HandleFunc("POST /webhook-endpoints/{id}/replay", a.handleReplay)
	mux.HandleFunc("GET /outbox/stats", a.handleStats)
	mux.HandleFunc("GET /outbox/relays", a.handleRelays)
	mux.HandleFunc("GET /outbox/messages", a.handleListMessages)
	mux.HandleFunc("GET /outbox/messages/{id}", a.handleGetMessage)
	mux.HandleFunc("POST /outbox/messages/{id}/retry", a.handleRetry)
	mux.HandleFunc("POST /outbox/messages/{id}/skip", a.handleSkip)
	mux.HandleFunc("GET /event-types", a.handleEventTypes)
	return mux
}

// createEndpointRequest names the destination by kind: a webhook's url
// (the default kind), a NATS subject, a Kafka topic, or a RabbitMQ exchange
// and routing key.
type createEndpointRequest struct {
	destination.Spec
	EventTypes []string `json:"event_types"`
}

func (a *Service) handleCreateEndpoint(w http.ResponseWriter, r *http.Request) {
	var req createEndpointRequest
	if err := httpjson.Decode(w, r, &req); err != nil {
		httpjson.WriteError(w, err)
		return
	}
	key, err := httpjson.IdempotencyKey(r)
	if err != nil {
		httpjson.WriteError(w, err)
		return
	}
	u, err := req.URLOf()
	if err != nil {
		a.writeError(w, r, invalidAs(ErrInvalidEndpoint, "", err))
		return
	}
	var ep Endpoint
	var replayed bool
	if key != "" {
		ep, replayed, err = a.CreateEndpointWithKey(r.Context(), key, u, req.EventTypes)
	} else {
		ep, err = a.CreateEndpoint(r.Context(), u, req.EventTypes)
	}
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if replayed {
		w.Header().Set(httpjson.HeaderIdempotentReplayed, "true")
	}
	httpjson.Write(w, http.StatusCreated, ep)
}

func (a *Service) handleListEndpoints(w http.ResponseWriter, r *http.Request) {
	eps, err := a.Endpoints(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, eps)
}

func (a *Service) handleGetEndpoint(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	ep, err := a.Endpoint(r.Context(), id)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, ep)
}

// updateEndpointRequest moves the endpoint when it names a destination
// (the same fields as a creation, kind included), and changes its types
// when it names those. Pointers tell a field left out from one sent empty:
// {"url":""} is a move to nowhere, refused, not a change of nothing.
type updateEndpointRequest struct {
	Kind       *string  `json:"kind"`
	URL        *string  `json:"url"`
	Subject    *string  `json:"subject"`
	Topic      *string  `json:"topic"`
	Exchange   *string  `json:"exchange"`
	RoutingKey *string  `json:"routing_key"`
	EventTypes []string `json:"event_types"`
}

// destination is the destination the request names, if it names one.
func (req updateEndpointRequest) destination() (spec destination.Spec, named bool) {
	for _, f := range []struct {
		from *string
		to   *string
	}{{req.Kind, &spec.Kind}, {req.URL, &spec.URL}, {req.Subject, &spec.Subject}, {req.Topic, &spec.Topic},
		{req.Exchange, &spec.Exchange}, {req.RoutingKey, &spec.RoutingKey}} {
		if f.from != nil {
			*f.to, named = *f.from, true
		}
	}
	return spec, named
}

func (a *Service) handleUpdateEndpoint(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var req updateEndpointRequest
	if err := httpjson.Decode(w, r, &req); err != nil {
		httpjson.WriteError(w, err)
		return
	}
	change := EndpointChange{EventTypes: req.EventTypes}
	if spec, named := req.destination(); named {
		u, err := spec.URLOf()
		if err == nil && u == "" {
			err = invalid(destination.ErrInvalid, "the destination is empty")
		}
		if err != nil {
			a.writeError(w, r, invalidAs(ErrInvalidEndpoint, "", err))
			return
		}
		change.URL = &u
	}
	ep, err := a.UpdateEndpoint(r.Context(), id, change)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, ep)
}

type replayRequest struct {
	From       time.Time  `json:"from"`
	To         time.Time  `json:"to"`
	EventTypes []string   `json:"event_types"`
	After      *uuid.UUID `json:"after"`
	Limit      int        `json:"limit"`
	// DryRun only counts the events the replay would read.
	DryRun bool `json:"dry_run"`
}

func (a *Service) handleReplay(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var req replayRequest
	if err := httpjson.Decode(w, r, &req); err != nil {
		httpjson.WriteError(w, err)
		return
	}
	rp := Replay{From: req.From, To: req.To, EventTypes: req.EventTypes, After: req.After, Limit: req.Limit}
	if req.DryRun {
		d, err := a.ReplayCount(r.Context(), id, rp)
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, struct {
			Dry bool `json:"dry_run"`
			DryRun
		}{true, d})
		return
	}
	res, err := a.ReplayEvents(r.Context(), id, rp)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, res)
}

func (a *Service) handleDeleteEndpoint(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	discarded, err := a.DeleteEndpoint(r.Context(), id)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	// Deleting stops the endpoint's deliveries for good; say how many
	// messages that settled.
	w.Header().Set("Discarded-Messages", strconv.FormatInt(discarded, 10))
	w.WriteHeader(http.StatusNoContent)
}

func (a *Service) handleSetEnabled(enabled bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		ep, err := a.SetEndpointEnabled(r.Context(), id, enabled)
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, ep)
	}
}

type rotateSecretRequest struct {
	// Overlap is a Go duration; the previous secret stays valid that long.
	Overlap string `json:"overlap"`
}

func (a *Service) handleRotateSecret(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	overlap := 24 * time.Hour
	var req rotateSecretRequest
	if _, err := httpjson.DecodeOptional(w, r, &req); err != nil {
		httpjson.WriteError(w, err)
		return
	}
	key, err := httpjson.IdempotencyKey(r)
	if err != nil {
		httpjson.WriteError(w, err)
		return
	}
	if req.Overlap != "" {
		d, err := time.ParseDuration(req.Overlap)
		if err != nil {
			httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusUnprocessableEntity, "overlap must be a Go duration such as 24h, got %q", req.Overlap))
			return
		}
		overlap = d
	}
	var ep Endpoint
	var replayed bool
	if key != "" {
		ep, replayed, err = a.RotateSecretWithKey(r.Context(), id, overlap, key)
	} else {
		ep, err = a.RotateSecret(r.Context(), id, overlap)
	}
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if replayed {
		w.Header().Set(httpjson.HeaderIdempotentReplayed, "true")
	}
	httpjson.Write(w, http.StatusOK, ep)
}

func (a *Service) handleStats(w http.ResponseWriter, r *http.Request) {
	s, err := a.Stats(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, s)
}

func (a *Service) handleRelays(w http.ResponseWriter, r *http.Request) {
	s, err := a.Relays(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, s)
}

func (a *Service) handleListMessages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := MessageFilter{Status: q.Get("status"), Type: q.Get("type"), OrderingKey: q.Get("ordering_key"), Limit: 50}
	bad := func(format string, args ...any) {
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusBadRequest, format, args...))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			bad("limit must be an integer from 1 to 1000, got %q", v)
			return
		}
		f.Limit = n
	}
	for name, dst := range map[string]**uuid.UUID{"endpoint": &f.Destination, "event_id": &f.Event, "cursor": &f.Before} {
		if v := q.Get(name); v != "" {
			id, err := uuid.Parse(v)
			if err != nil {
				bad("%s must be a uuid, got %q", name, v)
				return
			}
			*dst = &id
		}
	}
	for name, dst := range map[string]**time.Time{"from": &f.CreatedFrom, "to": &f.CreatedTo} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				bad("%s must be an RFC 3339 time, got %q", name, v)
				return
			}
			*dst = &t
		}
	}
	msgs, next, err := a.Messages(r.Context(), f)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	// The body stays a plain array (the contract); the next page is a Link.
	if next != nil {
		nq := r.URL.Query()
		nq.Set("cursor", next.String())
		w.Header().Set("Link", fmt.Sprintf(`<%s?%s>; rel="next"`, r.URL.Path, nq.Encode()))
		w.Header().Set("X-Next-Cursor", next.String())
	}
	httpjson.Write(w, http.StatusOK, msgs)
}

func (a *Service) handleGetMessage(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	m, err := a.Message(r.Context(), id)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, m)
}

func (a *Service) handleRetry(w http.ResponseWriter, r *http.Request) {
	a.handleMessageAction(w, r, a.Retry)
}

func (a *Service) handleSkip(w http.ResponseWriter, r *http.Request) {
	a.handleMessageAction(w, r, a.Skip)
}

func (a *Service) handleMessageAction(w http.ResponseWriter, r *http.Request, act func(context.Context, uuid.UUID) (Message, error)) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	m, err := act(r.Context(), id)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, m)
}

// writeError maps the module's errors to problems; anything unexpected is
// logged here, once, and answered as a 500 without internals.
func (a *Service) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var status int
	switch {
	case errors.Is(err, ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, ErrIdempotencyConflict):
		// As POST /orders answers a key reused for another request.
		status = http.StatusUnprocessableEntity
	case errors.Is(err, ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, ErrInvalidEndpoint), errors.Is(err, ErrInvalidStatus), errors.Is(err, ErrInvalidReplay),
		errors.Is(err, ErrInvalidFilter):
		status = http.StatusUnprocessableEntity
	case errors.Is(err, context.DeadlineExceeded), db.StatementCanceled(err):
		// The request's deadline (process.HandlerTimeout) or the admin
		// pool's statement timeout: a slow database, not a defect.
		a.logger.WarnContext(r.Context(), "admin request took too long", slog.String("path", r.URL.Path), slog.Any("error", err))
		httpjson.WriteError(w, context.DeadlineExceeded)
		return
	default:
		a.logger.ErrorContext(r.Context(), "admin request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		httpjson.WriteError(w, err)
		return
	}
	// The reason, in the sender's terms: the chain of actions that wrapped
	// it is for the log, and this one is not logged.
	httpjson.WriteProblem(w, httpjson.NewProblem(status, "%s", Reason(err)))
}

func pathID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	// Only the canonical spelling (any case): uuid.Parse also reads
	// urn:uuid:…, {…} and 32 bare digits, which would give one resource
	// several addresses (for caches, logs and access rules).
	raw := r.PathValue("id")
	id, err := uuid.Parse(raw)
	if err != nil || !strings.EqualFold(id.String(), raw) {
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusNotFound, "no such id %q", raw))
		return uuid.UUID{}, false
	}
	return id, true
}
