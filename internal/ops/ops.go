// Package ops is the outbox's ops page: a small server-rendered web UI, served
// by the api under /ops, that answers an operator's questions without SQL —
// is anyone delivering, is the relay keeping up, what happened to this
// order or event, what failed and why, how is this endpoint doing — and
// lets them requeue or skip failed messages, create, edit, pause, resume,
// rotate and delete endpoints, discard what waits for one, and replay an
// endpoint's past events.
//
// It is html/template with embedded assets: no JavaScript at all, so it
// works in any browser and under a strict Content-Security-Policy. River
// UI, mounted beside it under JobsPath behind the same login, is the one
// JavaScript app (jobs.go). Every
// state-changing request of the page's own is a POST carrying the session's
// CSRF token (or made with the bearer header, which no browser adds), every
// action but creating an endpoint (whose form is its confirmation) asks for
// confirmation with a second POST, and every one is logged. River UI's JSON
// actions are guarded differently (jobsAuthed says how).
//
// Authentication is the admin token: either the Authorization: Bearer header
// (for scripts and proxies) or a login form that sets a session cookie. The
// cookie holds a random id, never the token; the database (ops_sessions)
// holds the id's HMAC, keyed from the token, and the session's expiry, so
// logging out ends a session in every api process, and changing ADMIN_TOKEN
// ends every session. Failed logins are throttled per client address and in
// all. Without a token configured the page answers 403, like the admin API.
//
// This package depends on internal/outbox (through admin.Service); outbox
// never depends on it.
package ops

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/orders/db"
	"github.com/outboxkit/orders/internal/httpjson"
	"github.com/outboxkit/orders/internal/ops/internal/opsdb"
	"github.com/outboxkit/orders/internal/outbox/admin"
)

// Options configure the ops page.
type Options struct {
	// Admin is the outbox's admin service the page reads and acts through.
	Admin *admin.Service
	// Pool is the database, which keeps the sessions of the login form.
	Pool *pgxpool.Pool
	// Token is the admin token (ADMIN_TOKEN). Empty closes the page: 403.
	Token string
	// CookieSecure marks the session cookie Secure (sent over HTTPS only)
	// even when this process serves plain HTTP: set it when a proxy in front
	// terminates TLS. A request that arrives over TLS gets a Secure cookie
	// either way.
	CookieSecure bool
	// Logger receives the operators' actions (never the token).
	Logger *slog.Logger
	// SessionTTL bounds a login; 0 means 8 hours.
	SessionTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// ReplayBudget bounds how long one request of a replay runs batches
	// before it stops and offers to continue; 0 means 10 seconds. It is
	// checked between batches, so a request always replays at least one.
	ReplayBudget time.Duration
	// Warnings are shown at the top of every page once signed in: what the
	// server's configuration leaves unsafe (secrets stored in the clear).
	Warnings []string
	// Jobs, if set, is River UI: served under JobsPath behind the same
	// login, so the jobs underneath the relay can be looked at too.
	Jobs http.Handler
	// Lookups make the modules' own ids searchable (an order id): each is
	// asked, in turn, about what an operator typed into the search box.
	Lookups []Lookup
	// UserAgent is the User-Agent the relay's webhooks carry
	// (process.UserAgent), shown with a message's headers so that an
	// operator and a receiver's logs name the same sender; empty leaves
	// the line out.
	UserAgent string
}

// Lookup is how a module makes its own ids searchable on the ops page: told
// what an operator typed, it says whether that names one of its entities
// and, if so, the ordering key of the entity's events. The page lists those
// events' deliveries, whenever they were written. ok is false for anything
// it does not know.
type Lookup func(ctx context.Context, q string) (found Found, ok bool, err error)

// Found is what a Lookup recognised: where its events are.
type Found struct {
	// Key is the ordering key of its events.
	Key string
}

const (
	// Prefix is where the page is mounted.
	Prefix = "/ops"
	// CookieName is the session cookie's name.
	CookieName = "ops_session"
	// CSRFField is the form field that carries the CSRF token.
	CSRFField = "csrf"

	maxFormBytes = 64 << 10
)

// Handler serves the ops page under Prefix.
type Handler struct {
	admin      *admin.Service
	sessions   *opsdb.Queries
	secure     bool
	throttle   *throttle
	warnings   []string
	logger     *slog.Logger
	now        func() time.Time
	ttl        time.Duration
	replayFor  time.Duration
	enabled    bool
	tokenSum   [sha256.Size]byte
	sessionKey []byte
	pages      *pages
	lookups    []Lookup
	userAgent  string
	// jobs: River UI is mounted at JobsPath.
	jobs      bool
	mux       *http.ServeMux
	crossOrig *http.CrossOriginProtection
}

// New returns the ops page handler. Mount it at both Prefix and Prefix+"/".
func New(o Options) *Handler {
	h := &Handler{
		admin:    o.Admin,
		secure:   o.CookieSecure,
		warnings: o.Warnings,
		logger:   cmp.Or(o.Logger, slog.Default()),
		now:      o.Now,
		ttl:      cmp.Or(o.SessionTTL, 8*time.Hour),
		// A replay request runs batches for this long, then hands back.
		replayFor: cmp.Or(o.ReplayBudget, 10*time.Second),
		enabled:   o.Token != "",
		lookups:   o.Lookups,
		userAgent: o.UserAgent,
		pages:     mustParsePages(),
		// A second line behind the CSRF tokens: browsers say where a
		// request comes from (Sec-Fetch-Site, Origin), and a POST from
		// another site is refused before any form is read.
		crossOrig: http.NewCrossOriginProtection(),
	}
	if h.now == nil {
		h.now = time.Now
	}
	if o.Pool != nil {
		h.sessions = opsdb.New(o.Pool)
	}
	h.throttle = newThrottle(h.now)
	h.tokenSum = sha256.Sum256([]byte(o.Token))
	// The session key is derived from the token: session ids are stored
	// under an HMAC keyed with it, so rotating the token ends every session.
	// The label only sets this key apart from other uses of the token; it
	// names no service, so a copy of the template carries no trace of it.
	mac := hmac.New(sha256.New, []byte(o.Token))
	mac.Write([]byte("ops session key v1"))
	h.sessionKey = mac.Sum(nil)

	mux := http.NewServeMux()
	mux.Handle("GET /ops/static/", staticHandler())
	mux.HandleFunc("GET /ops/login", h.handleLoginForm)
	mux.HandleFunc("POST /ops/login", h.handleLogin)
	mux.Handle("POST /ops/logout", h.authed(h.handleLogout))
	mux.Handle("GET /ops", h.authed(h.handleOverview))
	mux.Handle("GET /ops/{$}", h.authed(h.handleOverview))
	mux.Handle("GET /ops/messages", h.authed(h.handleMessages))
	mux.Handle("GET /ops/search", h.authed(h.handleSearch))
	mux.Handle("GET /ops/messages/{id}", h.authed(h.handleMessage))
	mux.Handle("POST /ops/messages/{id}/retry", h.authed(h.handleRetryMessage))
	mux.Handle("POST /ops/messages/{id}/skip", h.authed(h.handleSkipMessage))
	mux.Handle("GET /ops/endpoints/new", h.authed(h.handleNewEndpointForm))
	mux.Handle("POST /ops/endpoints/new", h.authed(h.handleCreateEndpoint))
	mux.Handle("GET /ops/endpoints/{id}", h.authed(h.handleEndpoint))
	mux.Handle("GET /ops/endpoints/{id}/edit", h.authed(h.handleEditEndpointForm))
	mux.Handle("POST /ops/endpoints/{id}/edit", h.authed(h.handleEditEndpoint))
	mux.Handle("POST /ops/endpoints/{id}/rotate-secret", h.authed(h.handleRotateSecret))
	mux.Handle("POST /ops/endpoints/{id}/discard-waiting", h.authed(h.handleDiscardWaiting))
	mux.Handle("POST /ops/endpoints/{id}/delete", h.authed(h.handleDeleteEndpoint))
	mux.Handle("POST /ops/endpoints/{id}/disable", h.authed(h.handleSetEnabled(false)))
	mux.Handle("POST /ops/endpoints/{id}/enable", h.authed(h.handleSetEnabled(true)))
	mux.Handle("POST /ops/endpoints/{id}/retry-failed", h.authed(h.handleRetryEndpoint))
	mux.Handle("GET /ops/endpoints/{id}/replay", h.authed(h.handleReplayForm))
	mux.Handle("POST /ops/endpoints/{id}/replay", h.authed(h.handleReplay))
	mux.Handle("GET /ops/event-types", h.authed(h.handleEventTypes))
	if o.Jobs != nil {
		h.jobs = true
		h.mountJobs(mux, o.Jobs)
	}
	mux.Handle("/ops/", h.authed(func(w http.ResponseWriter, r *http.Request) {
		h.renderError(w, r, http.StatusNotFound, "Not found", "There is no ops page at "+r.URL.Path+".")
	}))
	h.mux = mux
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// No script runs on these pages; styles and images only from here.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	if isJobsPath(r.URL.Path) {
		// Except River UI, a JavaScript app: jobsCSP (jobs.go) lets its own
		// scripts run, and none from elsewhere or inline.
		hd.Set("Content-Security-Policy", jobsCSP)
	}
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if !strings.HasPrefix(r.URL.Path, Prefix+"/static/") {
		hd.Set("Cache-Control", "no-store")
	}
	if !h.enabled && !strings.HasPrefix(r.URL.Path, Prefix+"/static/") {
		h.renderError(w, r, http.StatusForbidden, "Ops page disabled",
			"The server has no ADMIN_TOKEN, so the ops page and the admin routes are closed. Set ADMIN_TOKEN and restart the api.")
		return
	}
	if err := h.crossOrig.Check(r); err != nil {
		h.logger.WarnContext(r.Context(), "ops request refused: cross-origin",
			slog.String("path", r.URL.Path), slog.String("remote_addr", r.RemoteAddr))
		h.renderError(w, r, http.StatusForbidden, "Request refused", "Requests to the ops page must come from the ops page itself.")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// session is how a request was authenticated.
type session struct {
	// via is "cookie" or "bearer", for the logs.
	via string
	// csrf is the token forms must carry; empty for bearer requests, which a
	// browser cannot be tricked into sending.
	csrf string
	// throttled, on a refusal, is how long the client must wait before it
	// may try again.
	throttled time.Duration
}

type sessionKey struct{}

func sessionFrom(ctx context.Context) session {
	s, _ := ctx.Value(sessionKey{}).(session)
	return s
}

// authed admits requests with a valid bearer token or session cookie, and
// checks the CSRF token of every POST made with the cookie.
func (h *Handler) authed(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, ok, err := h.authenticate(r)
		if err != nil {
			h.actionError(w, r, err)
			return
		}
		if !ok {
			if s.throttled > 0 {
				h.renderThrottled(w, r, s.throttled)
				return
			}
			h.renderLogin(w, r, http.StatusUnauthorized, "")
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				h.renderError(w, r, http.StatusBadRequest, "Bad request", "The form could not be read.")
				return
			}
		}
		if r.Method == http.MethodPost && s.via == "cookie" {
			if !h.validCSRF(r, s) {
				h.logger.WarnContext(r.Context(), "ops request refused: bad csrf token",
					slog.String("path", r.URL.Path), slog.String("remote_addr", r.RemoteAddr))
				h.renderError(w, r, http.StatusForbidden, "Request refused",
					"This form has expired or did not come from the ops page. Go back, reload the page and try again.")
				return
			}
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	})
}

// authenticate reads the request's credentials. A bearer token counts as a
// login attempt: a wrong one is throttled like the form's (then throttled is
// set while its client is throttled); the right one always gets in.
// Another scheme (Basic, from a proxy that authenticates its users) is not
// ours: the session cookie decides, and nothing counts as a failed login.
func (h *Handler) authenticate(r *http.Request) (session, bool, error) {
	if got, ok := httpjson.BearerToken(r); ok {
		if h.tokenMatches(got) {
			return session{via: "bearer"}, true, nil
		}
		if wait := h.throttle.wait(clientAddr(r)); wait > 0 {
			return session{throttled: wait}, false, nil
		}
		h.throttle.fail(clientAddr(r))
		h.logger.WarnContext(r.Context(), "ops request refused: wrong bearer token", slog.String("remote_addr", r.RemoteAddr))
		return session{}, false, nil
	}
	c, err := r.Cookie(CookieName)
	if err != nil {
		return session{}, false, nil
	}
	ok, err := h.validSession(r.Context(), c.Value)
	if err != nil || !ok {
		return session{}, false, err
	}
	return session{via: "cookie", csrf: h.csrfToken(c.Value)}, true, nil
}

// tokenMatches compares in constant time; hashing first hides the length.
// RequireToken guards next (the admin API) with the admin token as a
// bearer token, as the ops page's bearer logins are: a wrong one is logged
// and counts against the page's login throttle (429 while it is
// throttled), the right one always gets in. Without a token configured the
// routes are closed (403), never open. A request with no bearer token is
// refused without counting.
func (h *Handler) RequireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.enabled {
			httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusForbidden, "admin routes are disabled: the server has no ADMIN_TOKEN"))
			return
		}
		got, ok := httpjson.BearerToken(r)
		if ok && h.tokenMatches(got) {
			next.ServeHTTP(w, r)
			return
		}
		if ok {
			addr := clientAddr(r)
			if wait := h.throttle.wait(addr); wait > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
				httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusTooManyRequests, "too many wrong admin tokens from here: try again later"))
				return
			}
			h.throttle.fail(addr)
			h.logger.WarnContext(r.Context(), "admin request refused: wrong bearer token", slog.String("remote_addr", r.RemoteAddr),
				slog.String("path", r.URL.Path))
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="admin"`)
		httpjson.WriteProblem(w, httpjson.NewProblem(http.StatusUnauthorized, "a valid admin bearer token is required"))
	})
}

func (h *Handler) tokenMatches(got string) bool {
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], h.tokenSum[:]) == 1
}

var b64 = base64.RawURLEncoding

// newSession stores a new session and returns its cookie value: 32 random
// bytes. Only their HMAC is stored, so the table gives no cookie away.
// Expired sessions are deleted on the way.
func (h *Handler) newSession(ctx context.Context) (string, error) {
	if h.sessions == nil {
		return "", errors.New("ops: no database for sessions (Options.Pool)")
	}
	id := make([]byte, 32)
	_, _ = rand.Read(id)
	value := b64.EncodeToString(id)
	now := h.now()
	if err := h.sessions.OpsSessionInsert(ctx, h.sign("session", value), now.Add(h.ttl)); err != nil {
		return "", fmt.Errorf("storing ops session: %w", err)
	}
	// Housekeeping: the session is stored, so a failure here is said, not
	// the login's.
	if _, err := h.sessions.OpsSessionsDeleteExpired(ctx, now); err != nil {
		h.logger.WarnContext(ctx, "deleting expired ops sessions", slog.Any("error", err))
	}
	return value, nil
}

// validSession reports whether a cookie names a live session: stored (not
// logged out, issued under this admin token) and not expired.
func (h *Handler) validSession(ctx context.Context, v string) (bool, error) {
	if h.sessions == nil {
		return false, nil
	}
	if id, err := b64.DecodeString(v); err != nil || len(id) != 32 {
		return false, nil
	}
	exp, err := h.sessions.OpsSessionExpiry(ctx, h.sign("session", v))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading ops session: %w", err)
	}
	return h.now().Before(exp), nil
}

// csrfToken is bound to the session cookie (double submit: the cookie and
// the form must agree), so a form from one session is refused in another.
func (h *Handler) csrfToken(cookie string) string {
	return b64.EncodeToString(h.sign("csrf", cookie))
}

func (h *Handler) validCSRF(r *http.Request, s session) bool {
	got := r.PostForm.Get(CSRFField)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

func (h *Handler) sign(purpose, msg string) []byte {
	mac := hmac.New(sha256.New, h.sessionKey)
	mac.Write([]byte(purpose))
	mac.Write([]byte{0})
	mac.Write([]byte(msg))
	return mac.Sum(nil)
}

func (h *Handler) sessionCookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: CookieName, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.secure || r.TLS != nil,
	}
}

func (h *Handler) handleLoginForm(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(CookieName); err == nil {
		if ok, err := h.validSession(r.Context(), c.Value); err == nil && ok {
			http.Redirect(w, r, nextPath(r.URL.Query().Get("next")), http.StatusSeeOther)
			return
		}
	}
	h.renderLogin(w, r, http.StatusOK, "")
}

// nextPath is where a login sends the browser: the page of this site it
// asked for (path and query), else the overview. Anything else — another
// site, a scheme, a path outside the ops page, the login itself — is the
// overview, so the parameter cannot redirect anywhere else.
func nextPath(v string) string {
	u, err := url.Parse(v)
	if v == "" || err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || strings.ContainsAny(v, "\\\r\n") ||
		strings.HasPrefix(v, "//") || (u.Path != Prefix && !strings.HasPrefix(u.Path, Prefix+"/")) ||
		u.Path == Prefix+"/login" || u.Path == Prefix+"/logout" || strings.Contains(u.Path, "/../") {
		return Prefix
	}
	return u.RequestURI()
}

func (h *Handler) handleLogin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.renderLogin(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	// The right token always gets in (see failuresGlobal); a wrong one
	// while throttled is answered 429, uncounted and unlogged.
	addr := clientAddr(r)
	if !h.tokenMatches(r.PostForm.Get("token")) {
		if wait := h.throttle.wait(addr); wait > 0 {
			h.renderThrottled(w, r, wait)
			return
		}
		h.throttle.fail(addr)
		h.logger.WarnContext(r.Context(), "ops login failed", slog.String("remote_addr", r.RemoteAddr))
		h.renderLogin(w, r, http.StatusUnauthorized, "That is not the admin token.")
		return
	}
	value, err := h.newSession(r.Context())
	if err != nil {
		h.actionError(w, r, err)
		return
	}
	http.SetCookie(w, h.sessionCookie(r, value, int(h.ttl.Seconds())))
	h.logger.InfoContext(r.Context(), "ops login", slog.String("remote_addr", r.RemoteAddr))
	http.Redirect(w, r, nextPath(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (h *Handler) handleLogout(w http.ResponseWriter, r *http.Request) {
	// Deleting the row ends the session everywhere: a copy of the cookie
	// replayed later, on any api process, is refused.
	if c, err := r.Cookie(CookieName); err == nil && h.sessions != nil {
		if err := h.sessions.OpsSessionDelete(r.Context(), h.sign("session", c.Value)); err != nil {
			h.actionError(w, r, fmt.Errorf("deleting ops session: %w", err))
			return
		}
	}
	http.SetCookie(w, h.sessionCookie(r, "", -1))
	h.logger.InfoContext(r.Context(), "ops logout", slog.String("remote_addr", r.RemoteAddr))
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}

// returnPath is where an action sends the browser afterwards: a path of this
// page (never another site), else the overview.
func returnPath(r *http.Request) string {
	p := r.PostForm.Get("return")
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || !strings.HasPrefix(p, "/") {
		return Prefix
	}
	// Judged as the redirect will send it: cleaned (http.Redirect cleans
	// it, and /ops/../x is not a page of ours) and with what the escapes
	// stand for (%5C is a backslash, which browsers read as a slash).
	clean := path.Clean(u.Path)
	if strings.ContainsAny(clean, "\\\t\r\n") ||
		(clean != Prefix && !strings.HasPrefix(clean, Prefix+"/")) {
		return Prefix
	}
	return (&url.URL{Path: clean}).EscapedPath()
}

// done redirects after an action, with a notice for the next page. counts
// are the notice's numbers, n then m (negative ones are left out).
func done(w http.ResponseWriter, r *http.Request, notice string, counts ...int) {
	q := url.Values{"done": {notice}}
	for i, name := range []string{"n", "m"} {
		if i < len(counts) && counts[i] >= 0 {
			q.Set(name, strconv.Itoa(counts[i]))
		}
	}
	http.Redirect(w, r, returnPath(r)+"?"+q.Encode(), http.StatusSeeOther)
}

// notices are the only texts a redirect can ask a page to show.
func notice(q url.Values) string {
	count := func(name string) string {
		v := q.Get(name)
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			return "?"
		}
		return v
	}
	n := count("n")
	switch q.Get("done") {
	case "retried":
		return "Message requeued: the relay will deliver it within moments."
	case "skipped":
		return "Message skipped: it is discarded and will not be sent again. The next message of its ordering key, if one waited behind it, is due now."
	case "replayed":
		m := count("m")
		were := "were"
		if m == "1" {
			were = "was"
		}
		return fmt.Sprintf("Replayed %s (%s already waiting %s skipped). The relay sends them within moments.",
			plural(n, "event", "events"), m, were)
	case "retried_all":
		if n == "1" {
			return "1 failed message requeued."
		}
		return n + " failed messages requeued."
	case "updated":
		return "Endpoint changed: what waits goes to its new URL, and its new event types apply from now on."
	case "discarded":
		return fmt.Sprintf("Discarded %s: they will not be sent.", plural(n, "waiting message", "waiting messages"))
	case "deleted":
		were := "were"
		if n == "1" {
			were = "was"
		}
		return fmt.Sprintf("Endpoint deleted: nothing more is sent to it; %s not yet delivered %s discarded.",
			plural(n, "message", "messages"), were)
	case "disabled":
		return "Endpoint paused: its messages wait until it is resumed."
	case "enabled":
		return "Endpoint resumed: the relay sends what waited for it."
	case "probing":
		return "Probing now: the relay sends one message to the endpoint, and resumes deliveries if it gets an answer."
	}
	return ""
}

// logAction records what an operator did, and how they were authenticated.
func (h *Handler) logAction(r *http.Request, action string, attrs ...slog.Attr) {
	args := []any{slog.String("action", action), slog.String("auth", sessionFrom(r.Context()).via),
		slog.String("remote_addr", r.RemoteAddr)}
	for _, a := range attrs {
		args = append(args, a)
	}
	h.logger.InfoContext(r.Context(), "ops action", args...)
}

// actionError answers a failed action with a page a person can act on.
func (h *Handler) actionError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, admin.ErrNotFound):
		h.renderError(w, r, http.StatusNotFound, "Not found", "It no longer exists: reload the ops page.")
	case errors.Is(err, admin.ErrConflict):
		h.renderError(w, r, http.StatusConflict, "Nothing to do",
			"Only failed messages can be retried or skipped, and this one is not failed (any more), or its endpoint was deleted. Reload the page to see its status.")
	case errors.Is(err, admin.ErrInvalidReplay):
		h.renderError(w, r, http.StatusBadRequest, "Cannot replay that", replayRefusal(err))
	case errors.Is(err, context.DeadlineExceeded), db.StatementCanceled(err):
		// The request's deadline, or the api's statement timeout for the
		// admin surface (ADMIN_STATEMENT_TIMEOUT).
		h.logger.WarnContext(r.Context(), "ops request took too long", slog.String("path", r.URL.Path), slog.Any("error", err))
		h.renderError(w, r, http.StatusServiceUnavailable, "Took too long",
			"The request ran out of time and was abandoned: the database may be slow. Reload the page to see what was done, and try again.")
	default:
		h.logger.ErrorContext(r.Context(), "ops request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		h.renderError(w, r, http.StatusInternalServerError, "Something went wrong",
			fmt.Sprintf("The request failed (%s). The server log has the details.", http.StatusText(http.StatusInternalServerError)))
	}
}

// plural is "1 event" or "3 events"; n is a count as the notice reads it
// ("?" when unreadable, which takes the plural).
func plural(n, one, many string) string {
	if n == "1" {
		return n + " " + one
	}
	return n + " " + many
}
