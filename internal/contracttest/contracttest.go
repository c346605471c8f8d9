// Package contracttest holds the tests' HTTP exchanges to the contract
// the service publishes, the OpenAPI description (openapi/openapi.yaml): a
// handler that answers an undescribed status, field or content type fails
// the test that provoked it. (Package eventstest does the same for the
// events the tests make the product emit.)
package contracttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	valerrors "github.com/pb33f/libopenapi-validator/errors"

	"github.com/outboxkit/orders/openapi"
)

// description is the validator of openapi/openapi.yaml, built once: the
// document does not change while tests run. Its validations are
// serialised: the library's caches are not documented as safe for
// concurrent use.
var description = sync.OnceValues(func() (*checker, error) {
	doc, err := libopenapi.NewDocument(openapi.Description)
	if err != nil {
		return nil, fmt.Errorf("reading openapi/openapi.yaml: %w", err)
	}
	v, errs := validator.NewValidator(doc, config.WithFormatAssertions(), config.WithStrictMode(),
		// Headers of no operation: what browsers send with every request
		// (the edge reads them for every route, as the description's
		// introduction says), and what the server, the edge and the ops
		// page set on every response.
		config.WithStrictIgnoredHeadersExtra("Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode", "Sec-Fetch-Dest", "Sec-Fetch-User",
			"Traceparent", "Tracestate", "Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy",
			"X-Frame-Options", "Cache-Control", "Allow", "Vary", "Set-Cookie"),
		// Values the description leaves free, documents of their own: an
		// event type's schema and example, a message's payload (each
		// type's data is described by its webhook).
		config.WithStrictIgnorePaths("$.body[*].schema.**", "$.body[*].example.**", "$.body.payload.**", "$.body[*].payload.**"))
	if len(errs) > 0 {
		return nil, fmt.Errorf("building the validator of openapi/openapi.yaml: %v", errs)
	}
	return &checker{v: v}, nil
})

type checker struct {
	mu sync.Mutex
	v  validator.Validator
}

// Client returns c (nil: a new client) with a transport that checks
// every exchange against the description, failing t for each
// discrepancy:
//
//   - a response the description does not allow for its request's
//     operation (status, content type, headers, body and its fields);
//   - a request the description refuses answered with success: the
//     description would be stricter than the server;
//   - a route the description lacks answered with anything but the
//     router's 404 or 405, or the edge's 421 (a Host not answered).
//
// A request the description refuses is still sent: tests send bad input
// on purpose, and its answer must be an error the description allows.
func Client(t testing.TB, c *http.Client) *http.Client {
	t.Helper()
	d, err := description()
	if err != nil {
		t.Fatal(err)
	}
	out := &http.Client{}
	if c != nil {
		*out = *c
	}
	next := out.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	out.Transport = &transport{t: t, d: d, next: next}
	return out
}

type transport struct {
	t    testing.TB
	d    *checker
	next http.RoundTripper
}

// RoundTrip sends the request and checks the exchange; a discrepancy
// fails the test, and the response goes to the caller as it came.
func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	resp, err := tr.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	if problems := tr.d.check(req, body, resp, respBody); len(problems) > 0 {
		tr.t.Errorf("%s %s answered %d, which openapi/openapi.yaml does not allow:\n  %s\nrequest body: %.300s\nresponse body: %.300s",
			req.Method, req.URL.Path, resp.StatusCode, strings.Join(problems, "\n  "), body, respBody)
	}
	return resp, nil
}

// check returns what in the exchange the description does not allow.
func (d *checker) check(req *http.Request, body []byte, resp *http.Response, respBody []byte) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	// The validator reads the bodies: each gets its own copy.
	vreq := req.Clone(context.Background())
	vreq.Body = io.NopCloser(bytes.NewReader(body))
	if len(body) > 0 && vreq.Header.Get("Content-Type") == "" {
		// Read as JSON, as the description says: it has no way to name
		// a request without a media type.
		vreq.Header.Set("Content-Type", "application/json")
	}
	vresp := *resp
	vresp.Body = io.NopCloser(bytes.NewReader(respBody))

	reqOK, reqErrs := d.v.ValidateHttpRequestSync(vreq)
	if slices.ContainsFunc(reqErrs, func(e *valerrors.ValidationError) bool { return e.ValidationType == "path" }) {
		// Not a described route: the router's or the edge's refusal.
		switch resp.StatusCode {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusMisdirectedRequest:
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
				return nil
			}
		}
		return []string{"the route is not described: " + describe(reqErrs)}
	}
	var problems []string
	if !reqOK && resp.StatusCode < 400 {
		problems = append(problems, "the description refuses the request, which the server accepted: "+describe(reqErrs))
	}
	vreq.Body = io.NopCloser(bytes.NewReader(body))
	if ok, errs := d.v.ValidateHttpResponse(vreq, &vresp); !ok {
		problems = append(problems, describe(errs))
	}
	return problems
}

// describe writes validation errors in one line each.
func describe(errs []*valerrors.ValidationError) string {
	var lines []string
	for _, e := range errs {
		line := e.Message
		if e.Reason != "" && e.Reason != e.Message {
			line += ": " + e.Reason
		}
		for _, se := range e.SchemaValidationErrors {
			line += fmt.Sprintf(" [%s: %s]", se.FieldPath, se.Reason)
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "; ")
}
