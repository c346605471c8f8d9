package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// JobsPath is where River UI (Options.Jobs) is served: the River queues and
// jobs underneath the relay, behind the ops page's login.
const JobsPath = Prefix + "/river"

// jobsCSP replaces the page's script-free policy under JobsPath. River UI is
// a JavaScript app built ahead of time: its index loads one module script and
// one stylesheet from its own prefix, reads its settings from a
// <script type="application/json"> data block (never executed), draws
// checkboxes and selects with data: SVGs from its stylesheet, and fetches
// its JSON API under JobsPath. Scripts come from 'self' alone: no inline
// script, no eval (its validation library probes for eval once and, refused,
// does without), nothing from another origin, so an injected script cannot
// run. Styles need 'unsafe-inline': its toasts (goober) and theme switch
// (next-themes) write <style> elements at run time, with no nonce to give
// them. Inline styles run no code. Framing stays forbidden as on every ops
// page.
const jobsCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// maxJobsBody bounds River UI's JSON requests, which it reads whole: a list
// of job ids or a queue's settings is a few kilobytes at most.
const maxJobsBody = 1 << 20

// maxLoggedBody is how much of a River UI action's request the log keeps:
// enough for the job ids an operator cancelled, retried or deleted.
const maxLoggedBody = 1024

// isJobsPath reports whether a request is for River UI, whose pages get
// jobsCSP.
func isJobsPath(p string) bool {
	return p == JobsPath || strings.HasPrefix(p, JobsPath+"/")
}

// mountJobs serves River UI (its pages, assets and API, all under JobsPath)
// behind the login. River UI must have been built with JobsPath as its
// prefix.
func (h *Handler) mountJobs(mux *http.ServeMux, jobs http.Handler) {
	guarded := h.jobsAuthed(jobs)
	mux.Handle(JobsPath, guarded)
	mux.Handle(JobsPath+"/", guarded)
}

// jobsAuthed admits River UI's requests with the same credentials as the
// ops page: the bearer token, or the session cookie. It is not authed,
// whose CSRF check wants a form field: River UI's actions (cancel, retry
// and delete jobs; pause, resume and update queues) are JSON requests made
// by its JavaScript, with no form. Their CSRF defence is elsewhere, and
// sufficient:
//
//   - ServeHTTP refuses every cross-origin POST, PUT, PATCH and DELETE
//     (http.CrossOriginProtection, from Sec-Fetch-Site or Origin) before
//     any route runs, so another site cannot make a logged-in browser act —
//     including with a text/plain form whose body parses as JSON, which
//     River UI's API would otherwise read.
//   - The session cookie is SameSite=Strict and scoped to /ops, so a
//     browser sends it with no request that another site starts.
//   - A browser never adds the bearer header by itself.
//
// Every state-changing request is logged as an ops action, like the page's
// own, with what it asked for and how River UI answered.
func (h *Handler) jobsAuthed(jobs http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// River UI's own fetches and anything that is not a page load get
		// status codes its JavaScript (or a script) can act on; a person
		// opening a page is sent to the login form instead.
		page := (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
			r.URL.Path != JobsPath+"/api" && !strings.HasPrefix(r.URL.Path, JobsPath+"/api/")
		s, ok, err := h.authenticate(r)
		switch {
		case err != nil && page:
			h.actionError(w, r, err)
			return
		case err != nil:
			h.logger.ErrorContext(r.Context(), "ops request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
			jobsError(w, http.StatusInternalServerError, "The request failed. The server log has the details.")
			return
		case !ok && s.throttled > 0 && page:
			h.renderThrottled(w, r, s.throttled)
			return
		case !ok && s.throttled > 0:
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(s.throttled.Seconds()))))
			jobsError(w, http.StatusTooManyRequests, "Too many failed sign-ins from here: try again later.")
			return
		case !ok && page:
			http.Redirect(w, r, Prefix+"/login?"+url.Values{"next": {r.URL.RequestURI()}}.Encode(), http.StatusSeeOther)
			return
		case !ok:
			w.Header().Set("WWW-Authenticate", `Bearer realm="admin"`)
			jobsError(w, http.StatusUnauthorized, "Sign in to the ops page (or send the admin token as a bearer token), then reload.")
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, s))
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			jobs.ServeHTTP(w, r)
			return
		}

		// Read here, whole, so that its size is bounded and the log can say
		// which jobs or queue the action was for; River UI reads it again.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJobsBody))
		if err != nil {
			if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
				jobsError(w, http.StatusRequestEntityTooLarge, "The request is too large.")
				return
			}
			jobsError(w, http.StatusBadRequest, "The request could not be read.")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		jobs.ServeHTTP(rec, r)
		logged := string(body)
		if len(logged) > maxLoggedBody {
			logged = logged[:maxLoggedBody] + "…"
		}
		h.logAction(r, "river_ui", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("body", logged), slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)))
	})
}

// jobsError answers in River UI's own error shape, whose message its pages
// show.
func jobsError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"message": msg})
}

// statusRecorder keeps the status River UI answered an action with, for the
// log.
type statusRecorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wroteHeader {
		s.status, s.wroteHeader = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
