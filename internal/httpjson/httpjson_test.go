package httpjson_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
			var dst struct{ A int }
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
