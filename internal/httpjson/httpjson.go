// Package httpjson is the JSON edge shared by the modules' HTTP handlers:
// strict request decoding and RFC 9457 problem details for errors, so every
// route answers bad input the same clear way.
package httpjson

import (
	"bufio"
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"
)

// MaxBody is the largest request body accepted (1 MiB).
const MaxBody = 1 << 20

// Problem is an RFC 9457 problem details body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Error is a Problem that can travel as an error.
func (p *Problem) Error() string { return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail) }

// NewProblem returns a problem with the status's standard title.
func NewProblem(status int, detail string, args ...any) *Problem {
	return &Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: fmt.Sprintf(detail, args...)}
}

// WriteProblem writes p as application/problem+json.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// WriteError writes err as a problem: a *Problem as itself, anything else as
// a 500 whose detail does not leak internals.
func WriteError(w http.ResponseWriter, err error) {
	var p *Problem
	if errors.As(err, &p) {
		WriteProblem(w, p)
		return
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// The request's deadline (process.WithDeadline) passed: its
		// statements were cancelled, and a transaction not yet committed
		// was rolled back.
		WriteProblem(w, NewProblem(http.StatusServiceUnavailable, "the request took too long and was abandoned; retry it later"))
		return
	}
	WriteProblem(w, NewProblem(http.StatusInternalServerError, "the server failed to handle the request"))
}

// Write writes v as JSON with status.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Decode reads exactly one JSON value into dst from a body of at most
// MaxBody bytes, refusing unknown fields (names match exactly, not ignoring
// case as encoding/json does), a name given twice in one object, escaped
// lone surrogates, trailing data and content types that say the body is
// something else. Its errors are *Problem values with a
// detail a client can act on.
//
// No content type, application/json and any +json type are read as JSON.
// So is application/x-www-form-urlencoded from a client that is not a
// browser: it is what `curl -d` sends unless told otherwise, and refusing a
// JSON body over a default header helps nobody. From a browser (see
// FromBrowser) it is refused with 415: a form is how another site's page
// would post here without a CORS preflight, and no page of ours posts forms
// to the JSON API. The body itself must still be valid JSON.
func Decode(w http.ResponseWriter, r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		switch {
		case err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")):
		case err == nil && mt == formType && !FromBrowser(r):
		case err == nil && mt == formType:
			return browserFormProblem(ct)
		default:
			return NewProblem(http.StatusUnsupportedMediaType, "content-type must be application/json, got %q", ct)
		}
	}
	// Read the whole (bounded) body first: JSON text must be UTF-8 (RFC 8259
	// section 8.1), and encoding/json would otherwise silently replace
	// invalid bytes in strings with U+FFFD, storing something the client
	// never sent.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		return readProblem(err)
	}
	if !utf8.Valid(body) {
		return NewProblem(http.StatusBadRequest, "request body must be UTF-8 encoded JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeProblem(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return NewProblem(http.StatusBadRequest, "request body must hold a single JSON value")
	}
	if err := strictNames(body, reflect.TypeOf(dst)); err != nil {
		return err
	}
	return loneSurrogate(body)
}

// DecodeOptional is Decode for a request whose body may be left out: an
// empty body leaves dst as it was and reports false. Empty whether the
// client said so by its header (Content-Length: 0) or sent a chunked body
// with nothing in it, which only reading tells. A body that could not be
// read is answered as Decode answers it.
func DecodeOptional(w http.ResponseWriter, r *http.Request, dst any) (present bool, err error) {
	body := bufio.NewReader(r.Body)
	if _, err := body.Peek(1); errors.Is(err, io.EOF) {
		return false, nil
	} else if err != nil {
		return false, readProblem(err)
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{body, r.Body}
	return true, Decode(w, r, dst)
}

const formType = "application/x-www-form-urlencoded"

// FromBrowser reports whether r was sent by a web browser: browsers add
// Origin to cross-origin and to non-GET requests, and Sec-Fetch-* metadata
// to every request since 2023; curl and HTTP libraries send neither.
func FromBrowser(r *http.Request) bool {
	if r.Header.Get("Origin") != "" {
		return true
	}
	for name := range r.Header {
		if strings.HasPrefix(name, "Sec-Fetch-") {
			return true
		}
	}
	return false
}

// RefuseBrowserForms answers 415 to a state-changing request from a browser
// whose body is one a page can send without a CORS preflight
// (application/x-www-form-urlencoded, multipart/form-data, text/plain), even
// when the handler behind it reads no body: a JSON API has no forms, so such
// a request is never one of ours. Clients that are not browsers are let
// through; Decode decides what their bodies may be.
func RefuseBrowserForms(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if ct := r.Header.Get("Content-Type"); ct != "" && FromBrowser(r) {
				mt, _, err := mime.ParseMediaType(ct)
				if err != nil || mt == formType || mt == "multipart/form-data" || mt == "text/plain" {
					WriteProblem(w, browserFormProblem(ct))
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

func browserFormProblem(ct string) *Problem {
	return NewProblem(http.StatusUnsupportedMediaType,
		"content-type must be application/json, got %q from a browser (form bodies are read as JSON only from clients that send no Origin or Sec-Fetch-* headers)", ct)
}

// readProblem answers a body that could not be read. The error names the
// connection's addresses (the server's own, behind a load balancer), so it
// is not quoted.
func readProblem(err error) *Problem {
	var (
		tooLarge *http.MaxBytesError
		netErr   net.Error
	)
	switch {
	case errors.As(err, &tooLarge):
		return NewProblem(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", tooLarge.Limit)
	case errors.As(err, &netErr) && netErr.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return NewProblem(http.StatusRequestTimeout, "request body not received in time")
	default:
		return NewProblem(http.StatusBadRequest, "request body could not be read")
	}
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// jsonKind names what a Go type is decoded from, in JSON's terms: a
// client's error names the value it should send, not the server's types.
func jsonKind(t reflect.Type) string {
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		return "a string" // uuid.UUID, time.Time: arrays and structs in Go
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer that fits in %d bits", t.Bits())
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	default:
		return "another kind of value"
	}
}

func decodeProblem(err error) *Problem {
	var (
		syntax    *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		tooLarge  *http.MaxBytesError
		fieldName = func(e *json.UnmarshalTypeError) string {
			if e.Field != "" {
				return e.Field
			}
			return "value"
		}
	)
	switch {
	case errors.As(err, &tooLarge):
		return NewProblem(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", tooLarge.Limit)
	case errors.As(err, &syntax):
		return NewProblem(http.StatusBadRequest, "malformed JSON at byte %d: %v", syntax.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return NewProblem(http.StatusBadRequest, "malformed JSON: unexpected end of body")
	case errors.Is(err, io.EOF):
		return NewProblem(http.StatusBadRequest, "request body is empty")
	case errors.As(err, &typeErr):
		return NewProblem(http.StatusUnprocessableEntity, "field %q must be %s, got JSON %s", fieldName(typeErr), jsonKind(typeErr.Type), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return NewProblem(http.StatusUnprocessableEntity, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return NewProblem(http.StatusBadRequest, "malformed JSON: %v", err)
	}
}

// BearerToken returns the token of a request's Authorization header and
// whether the header uses the Bearer scheme, whose name is case-insensitive
// (RFC 9110). Any other scheme (Basic, added by a proxy that authenticates
// its users) is not a bearer token, and ok is false.
func BearerToken(r *http.Request) (token string, ok bool) {
	scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// Idempotency-Key: a client that sends a creating request again (its
// answer was lost) with the same key gets the first request's answer,
// marked with IdempotentReplayed, instead of a second creation.
const (
	HeaderIdempotencyKey     = "Idempotency-Key"
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// IdempotencyKey reads r's Idempotency-Key: "" when there is none. A key
// sent more than once, or sent empty, is a 400 problem: which one the
// client meant is anyone's guess (a proxy may have added one), and a
// request taken without its key would make its retry a second creation.
// The key's length and text are the service's to judge.
func IdempotencyKey(r *http.Request) (string, error) {
	keys := r.Header.Values(HeaderIdempotencyKey)
	if len(keys) > 1 {
		return "", NewProblem(http.StatusBadRequest, "%s must be given at most once, got %d", HeaderIdempotencyKey, len(keys))
	}
	if len(keys) == 1 && strings.TrimSpace(keys[0]) == "" {
		return "", NewProblem(http.StatusBadRequest, "%s must not be empty", HeaderIdempotencyKey)
	}
	return r.Header.Get(HeaderIdempotencyKey), nil
}
