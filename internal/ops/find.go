package ops

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/orders/internal/outbox"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// "What happened to order X / event Y?": one search box for any id, and a
// message list with filters and pagination.

// pageSize is how many messages a list page shows.
const pageSize = 50

type messagesPage struct {
	Layout
	Filter    listFilter
	Endpoints []admin.Endpoint
	Messages  []messageRow
	// Older is the link to the next (older) page; empty on the last one.
	Older string
	// Newer is the link to the page before (newer); empty on the first.
	Newer string
	// Paged: this is not the first page.
	Paged bool
	// Statuses are the status filter's choices.
	Statuses []string
	// Error explains a filter that could not be read.
	Error string
}

// listFilter is the list's filter as the form holds it (text), and the
// outbox filter it reads as.
type listFilter struct {
	Status, Type, Endpoint, Key, Event, From, To string
}

// query is the filter as URL parameters, without the page cursor.
func (f listFilter) query() url.Values {
	q := url.Values{}
	for name, v := range map[string]string{"status": f.Status, "type": f.Type, "endpoint": f.Endpoint, "key": f.Key,
		"event": f.Event, "from": f.From, "to": f.To} {
		if v != "" {
			q.Set(name, v)
		}
	}
	return q
}

// Active reports whether anything is filtered.
func (f listFilter) Active() bool { return len(f.query()) > 0 }

// parse reads the form into an outbox filter; a value that cannot be read
// is an error that names the field.
func (f listFilter) parse() (admin.MessageFilter, error) {
	mf := admin.MessageFilter{Status: f.Status, Type: f.Type, OrderingKey: f.Key, Limit: pageSize}
	if !isText(f.Type) || !isText(f.Key) {
		return mf, errors.New("type and key must be text (UTF-8, no NUL bytes)")
	}
	if f.Status != "" && !slices.Contains(outbox.Statuses, f.Status) {
		return mf, errors.New("status must be one of " + strings.Join(outbox.Statuses, ", "))
	}
	for name, p := range map[string]struct {
		v   string
		dst **uuid.UUID
	}{"Endpoint": {f.Endpoint, &mf.Destination}, "Event id": {f.Event, &mf.Event}} {
		if p.v == "" {
			continue
		}
		id, err := uuid.Parse(p.v)
		if err != nil {
			return mf, errors.New(name + " must be an id (a UUID)")
		}
		*p.dst = &id
	}
	for name, p := range map[string]struct {
		v   string
		dst **time.Time
	}{"From": {f.From, &mf.CreatedFrom}, "To": {f.To, &mf.CreatedTo}} {
		if p.v == "" {
			continue
		}
		t, err := time.ParseInLocation(localMinute, p.v, time.UTC)
		if err != nil {
			return mf, errors.New(name + " must be a date and time (UTC)")
		}
		*p.dst = &t
	}
	return mf, nil
}

func (h *Handler) handleMessages(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	f := listFilter{Status: q.Get("status"), Type: strings.TrimSpace(q.Get("type")), Endpoint: q.Get("endpoint"),
		Key: strings.TrimSpace(q.Get("key")), Event: strings.TrimSpace(q.Get("event")), From: q.Get("from"), To: q.Get("to")}
	eps, err := h.admin.Endpoints(ctx)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	p := messagesPage{Layout: h.layout(r, "Messages"), Filter: f, Endpoints: eps, Statuses: outbox.Statuses}
	mf, err := f.parse()
	for _, c := range []struct {
		name string
		dst  **uuid.UUID
	}{{"before", &mf.Before}, {"after", &mf.After}} {
		if err != nil || q.Get(c.name) == "" {
			continue
		}
		id, perr := uuid.Parse(q.Get(c.name))
		if perr != nil {
			err = errors.New("the page cursor is not an id: start again from the newest")
		}
		*c.dst, p.Paged = &id, true
	}
	if err != nil {
		p.Error = err.Error()
		h.render(w, r, http.StatusBadRequest, "messages", p)
		return
	}
	if mf.After != nil {
		// One more than a page: whether anything is newer still.
		mf.Limit = pageSize + 1
	}
	msgs, next, err := h.admin.Messages(ctx, mf)
	if err == nil && mf.After != nil {
		if len(msgs) <= pageSize {
			// Nothing newer than a page: the page before is the first.
			mf.After, mf.Before, mf.Limit, p.Paged = nil, nil, pageSize, false
			msgs, next, err = h.admin.Messages(ctx, mf)
		} else {
			msgs = msgs[1:]
		}
	}
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	urls := make(map[uuid.UUID]string, len(eps))
	for _, e := range eps {
		urls[e.ID] = e.URL
	}
	for _, m := range msgs {
		p.Messages = append(p.Messages, messageRow{Message: m, EndpointURL: urls[m.Destination]})
	}
	if next != nil {
		nq := f.query()
		nq.Set("before", next.String())
		p.Older = Prefix + "/messages?" + nq.Encode()
	}
	if p.Paged {
		p.Newer = p.NewestLink()
		if len(msgs) > 0 {
			nq := f.query()
			nq.Set("after", msgs[0].ID.String())
			p.Newer = Prefix + "/messages?" + nq.Encode()
		}
	}
	h.render(w, r, http.StatusOK, "messages", p)
}

// NewestLink is the first page of the same filter.
func (p messagesPage) NewestLink() string {
	if q := p.Filter.query(); len(q) > 0 {
		return Prefix + "/messages?" + q.Encode()
	}
	return Prefix + "/messages"
}

// keyLink lists the deliveries of one ordering key's events, whatever their
// time: the key's index (outbox_events_ordering_key_idx) finds them.
func keyLink(key string) string { return Prefix + "/messages?" + url.Values{"key": {key}}.Encode() }

type searchPage struct {
	Layout
	Query string
	// Event is set when the query is an event recorded with no delivery.
	Event *uuid.UUID
	// Endpoints are the endpoints whose URL contains the query.
	Endpoints []admin.Endpoint
}

// isText reports whether s can name anything stored: valid UTF-8 without
// NUL bytes (PostgreSQL refuses anything else as a statement's text).
func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// handleSearch takes whatever an operator pasted — a message id, an event
// id (webhook-id), an endpoint id, an order id or another ordering key, or
// part of an endpoint's URL — and goes where it leads.
func (h *Handler) handleSearch(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if q == "" {
		http.Redirect(w, r, Prefix+"/messages", http.StatusSeeOther)
		return
	}
	to := func(path string) { http.Redirect(w, r, path, http.StatusSeeOther) }
	p := searchPage{Layout: h.layout(r, "Search"), Query: q}
	if !isText(q) {
		// Not text: no id, key or URL is made of it.
		p.Query = strings.ToValidUTF8(strings.ReplaceAll(q, "\x00", ""), "\uFFFD")
		h.render(w, r, http.StatusBadRequest, "search", p)
		return
	}
	if id, err := uuid.Parse(q); err == nil {
		switch _, err := h.admin.Message(ctx, id); {
		case err == nil:
			to(Prefix + "/messages/" + id.String())
			return
		case !errors.Is(err, admin.ErrNotFound):
			h.actionError(w, r, err)
			return
		}
		msgs, _, err := h.admin.Messages(ctx, admin.MessageFilter{Event: &id, Limit: 1})
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		if len(msgs) > 0 {
			to(Prefix + "/messages?" + url.Values{"event": {id.String()}}.Encode())
			return
		}
		recorded, err := h.admin.EventRecorded(ctx, id)
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		if recorded {
			p.Event = &id
			h.render(w, r, http.StatusOK, "search", p)
			return
		}
		switch _, err := h.admin.Endpoint(ctx, id); {
		case err == nil:
			to(Prefix + "/endpoints/" + id.String())
			return
		case !errors.Is(err, admin.ErrNotFound):
			h.actionError(w, r, err)
			return
		}
	}
	// An id a module knows (an order's): its events, by their key.
	for _, look := range h.lookups {
		f, ok, err := look(ctx, q)
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		if ok {
			to(keyLink(f.Key))
			return
		}
	}
	// Any other ordering key, whatever its events' time: a few pages of the
	// key's index, for a key that is there or not.
	msgs, _, err := h.admin.Messages(ctx, admin.MessageFilter{OrderingKey: q, Limit: 1})
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	if len(msgs) > 0 {
		to(keyLink(q))
		return
	}
	eps, err := h.admin.Endpoints(ctx)
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	for _, e := range eps {
		if strings.Contains(strings.ToLower(e.URL), strings.ToLower(q)) {
			p.Endpoints = append(p.Endpoints, e)
		}
	}
	if len(p.Endpoints) == 1 {
		to(Prefix + "/endpoints/" + p.Endpoints[0].ID.String())
		return
	}
	h.render(w, r, http.StatusOK, "search", p)
}
