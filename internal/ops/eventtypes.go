package ops

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/outboxkit/orders/internal/outbox/admin"
)

// eventTypesPage is the event catalog as receivers code against it: each
// type's schema and example, and who subscribes to it.
type eventTypesPage struct {
	Layout
	Types []eventTypeView
	// Unknown are types endpoints still name that no module emits any more.
	Unknown []eventTypeView
}

type eventTypeView struct {
	admin.EventType
	SchemaID        string
	Schema, Example string
}

func (h *Handler) handleEventTypes(w http.ResponseWriter, r *http.Request) {
	subs, err := h.admin.Subscriptions(r.Context())
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	p := eventTypesPage{Layout: h.layout(r, "Event types")}
	for _, t := range subs.Types {
		p.Types = append(p.Types, eventTypeView{EventType: t, SchemaID: t.SchemaID(), Schema: indented(t.Schema), Example: indented(t.Example)})
	}
	for _, t := range subs.Unknown {
		p.Unknown = append(p.Unknown, eventTypeView{EventType: t})
	}
	h.render(w, r, http.StatusOK, "event_types", p)
}

// indented is JSON indented for a <pre>, or as it is if it does not parse.
func indented(b []byte) string {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}
