package orders

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/outboxkit/orders/internal/httpjson"
)

// Handler returns the orders routes, as openapi/openapi.yaml describes them.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.handlePlace)
	mux.HandleFunc("GET /orders/{id}", s.handleGet)
	mux.HandleFunc("POST /orders/{id}/cancel", s.handleCancel)
	return mux
}

func (s *Service) handlePlace(w http.ResponseWriter, r *http.Request) {
	var req PlaceRequest
	if err := httpjson.Decode(w, r, &req); err != nil {
		httpjson.WriteError(w, err)
		return
	}
	key, err := httpjson.IdempotencyKey(r)
	if err != nil {
		httpjson.WriteError(w, err)
		return
	}
	req.IdempotencyKey = key
	order, replayed, err := s.Place(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/orders/"+order.ID.String())
	if replayed {
		w.Header().Set(httpjson.HeaderIdempotentReplayed, "true")
	}
	httpjson.Write(w, http.StatusCreated, order)
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	order, err := s.Get(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, order)
}

func (s *Service) handleCancel(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	order, err := s.Cancel(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, order)
}

// writeError maps the module's errors to problems; anything unexpected is
// logged here, once, and answered as a 500 without internals.
func (s *Service) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var invalid *ValidationError
	switch {
	case errors.As(err, &invalid):
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusUnprocessableEntity, "%s", invalid.Error()))
	case errors.Is(err, ErrNotFound):
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusNotFound, "no order with id %s", r.PathValue("id")))
	case errors.Is(err, ErrIdempotencyConflict):
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusUnprocessableEntity,
			"Idempotency-Key %q was already used with a different request body", r.Header.Get("Idempotency-Key")))
	case errors.Is(err, context.DeadlineExceeded):
		// The request's deadline (process.HandlerTimeout): a slow
		// database, not a defect; WriteError answers 503.
		s.logger.WarnContext(r.Context(), "orders request took too long", slog.String("path", r.URL.Path), slog.Any("error", err))
		httpjson.WriteError(w, err)
	default:
		s.logger.ErrorContext(r.Context(), "orders request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		httpjson.WriteError(w, err)
	}
}

func orderID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	// Only the canonical spelling (any case): uuid.Parse also reads
	// urn:uuid:…, {…} and 32 bare digits, which would give one resource
	// several addresses (for caches, logs and access rules).
	raw := r.PathValue("id")
	id, err := uuid.Parse(raw)
	if err != nil || !strings.EqualFold(id.String(), raw) {
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusNotFound, "no order with id %q", raw))
		return uuid.UUID{}, false
	}
	return id, true
}
