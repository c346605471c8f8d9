package httpjson_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/httpjson"
)

// A form-encoded body is read as JSON from curl and other clients that are
// not browsers, and refused from a browser, which sends Origin or
// Sec-Fetch-* headers: a page on another site can post a form without a
// CORS preflight.
func TestDecodeReadsFormBodiesAsJSONOnlyFromNonBrowsers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		headers map[string]string
		status  int // 0: decoded
	}{
		{"curl -d", nil, 0},
		{"browser with Origin", map[string]string{"Origin": "https://evil.example"}, http.StatusUnsupportedMediaType},
		{"browser with Sec-Fetch-Site", map[string]string{"Sec-Fetch-Site": "same-origin"}, http.StatusUnsupportedMediaType},
		{"browser with Sec-Fetch-Mode only", map[string]string{"Sec-Fetch-Mode": "navigate"}, http.StatusUnsupportedMediaType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":1}`))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			var dst struct {
				A int `json:"a"`
			}
			err := httpjson.Decode(httptest.NewRecorder(), r, &dst)
			if tc.status == 0 {
				require.NoError(t, err)
				require.Equal(t, 1, dst.A, "the form-typed body is read as JSON")
				return
			}
			var p *httpjson.Problem
			require.ErrorAs(t, err, &p)
			require.Equal(t, tc.status, p.Status)
			require.Contains(t, p.Detail, "from a browser")
			require.Zero(t, dst.A, "nothing is decoded from a refused body")
		})
	}
}

// Decode takes a body as the client wrote it or not at all: encoding/json
// alone would match names ignoring case, let the second of two equal names
// win and store U+FFFD for an escaped lone surrogate, each a value the
// client (or a proxy reading the same body) did not mean.
func TestDecodeRefusesWhatEncodingJSONWouldBend(t *testing.T) {
	t.Parallel()
	type line struct {
		SKU string `json:"sku"`
	}
	type spec struct {
		Kind string `json:"kind,omitempty"`
	}
	type request struct {
		spec
		Customer string          `json:"customer_id"`
		Lines    []line          `json:"lines"`
		Data     json.RawMessage `json:"data"`
		Ignored  string          `json:"-"`
		After    *uuid.UUID      `json:"after"`
	}
	for _, tc := range []struct {
		body   string
		status int // 0: decoded
		detail string
	}{
		{`{"customer_id":"c-1","lines":[{"sku":"A"}],"kind":"nats","data":{"Any":1,"any":2}}`, 0, ""},
		{`{"customer_id":"\ud83d\ude00 and \u00e9"}`, 0, ""},
		{`{"Customer_ID":"c-1"}`, http.StatusUnprocessableEntity, `unknown field "Customer_ID"`},
		{`{"lines":[{"SKU":"A"}]}`, http.StatusUnprocessableEntity, `unknown field "lines[0].SKU"`},
		{`{"Kind":"nats"}`, http.StatusUnprocessableEntity, `unknown field "Kind"`},
		{`{"Ignored":"x"}`, http.StatusUnprocessableEntity, `unknown field "Ignored"`},
		{`{"customer_id":"a","customer_id":"b"}`, http.StatusBadRequest, `"customer_id" is given twice`},
		{`{"lines":[{"sku":"A","sku":"B"}]}`, http.StatusBadRequest, `"lines[0].sku" is given twice`},
		{`{"data":{"a":1,"a":2}}`, http.StatusBadRequest, `"data.a" is given twice`},
		{`{"customer_id":"\ud800"}`, http.StatusBadRequest, `half a UTF-16 surrogate pair`},
		{`{"customer_id":"\udc00\ud800x"}`, http.StatusBadRequest, `half a UTF-16 surrogate pair`},
		{`{"customer_id":"\\ud800"}`, 0, ""}, // an escaped backslash, then text
		// A wrong kind of value is named in JSON's terms, not the server's
		// Go types.
		{`[1]`, http.StatusUnprocessableEntity, `field "value" must be an object, got JSON array`},
		{`{"lines":{}}`, http.StatusUnprocessableEntity, `field "lines" must be an array, got JSON object`},
		{`{"customer_id":1}`, http.StatusUnprocessableEntity, `field "customer_id" must be a string, got JSON number`},
		{`{"after":[1]}`, http.StatusUnprocessableEntity, `field "after" must be a string, got JSON array`},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
		r.Header.Set("Content-Type", "application/json")
		var dst request
		err := httpjson.Decode(httptest.NewRecorder(), r, &dst)
		if tc.status == 0 {
			require.NoError(t, err, tc.body)
			continue
		}
		var p *httpjson.Problem
		require.ErrorAs(t, err, &p, tc.body)
		require.Equal(t, tc.status, p.Status, tc.body)
		require.Contains(t, p.Detail, tc.detail, tc.body)
	}
}

// timeoutError is what reading a body returns when the connection's read
// deadline passes.
type timeoutError struct{}

func (timeoutError) Error() string {
	return "read tcp 10.0.0.7:8080->203.0.113.9:51234: i/o timeout"
}
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

type failingBody struct{ err error }

func (b failingBody) Read([]byte) (int, error) { return 0, b.err }

// A body that could not be read is not "malformed JSON", and the reason is
// not quoted: it names the server's and the client's addresses. A body that
// stopped arriving is a 408.
func TestDecodeAnswersABodyThatCouldNotBeRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		status int
	}{
		{timeoutError{}, http.StatusRequestTimeout},
		{errors.New("read tcp 10.0.0.7:8080->203.0.113.9:51234: connection reset by peer"), http.StatusBadRequest},
	} {
		for name, decode := range map[string]func(http.ResponseWriter, *http.Request, any) error{
			"Decode": httpjson.Decode,
			"DecodeOptional": func(w http.ResponseWriter, r *http.Request, dst any) error {
				_, err := httpjson.DecodeOptional(w, r, dst)
				return err
			},
		} {
			r := httptest.NewRequest(http.MethodPost, "/", failingBody{tc.err})
			r.Header.Set("Content-Type", "application/json")
			var dst struct{}
			err := decode(httptest.NewRecorder(), r, &dst)
			var p *httpjson.Problem
			require.ErrorAs(t, err, &p, name)
			require.Equal(t, tc.status, p.Status, name)
			require.NotContains(t, p.Detail, "10.0.0.7", "%s: the server's address", name)
			require.NotContains(t, p.Detail, "JSON", "%s: nothing was wrong with the JSON", name)
		}
	}
}

// An optional body may be absent, whether the client said so by its
// Content-Length (0) or sent a chunked body with nothing in it; one that
// is there is decoded as Decode does.
func TestDecodeOptionalTakesAnEmptyBodyForNone(t *testing.T) {
	t.Parallel()
	type req struct {
		Overlap string `json:"overlap"`
	}
	empty := httptest.NewRequest(http.MethodPost, "/", http.NoBody)
	chunked := httptest.NewRequest(http.MethodPost, "/", io.MultiReader())
	chunked.ContentLength = -1
	for name, r := range map[string]*http.Request{"Content-Length: 0": empty, "chunked": chunked} {
		dst := req{Overlap: "default"}
		present, err := httpjson.DecodeOptional(httptest.NewRecorder(), r, &dst)
		require.NoError(t, err, name)
		require.False(t, present, name)
		require.Equal(t, "default", dst.Overlap, "%s: left as it was", name)
	}

	var dst req
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"overlap":"1h"}`))
	present, err := httpjson.DecodeOptional(httptest.NewRecorder(), r, &dst)
	require.NoError(t, err)
	require.True(t, present)
	require.Equal(t, "1h", dst.Overlap)

	r = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"overlap":1}`))
	_, err = httpjson.DecodeOptional(httptest.NewRecorder(), r, &dst)
	var p *httpjson.Problem
	require.ErrorAs(t, err, &p, "a body that is there is held to Decode's rules")
}
