package ops_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/ops"
)

// The server's configuration warnings head every page once signed in, and
// are not shown to whoever merely reaches the login page.
func TestWarningsOnEveryPage(t *testing.T) {
	t.Parallel()
	const warning = "OUTBOX_SECRET_KEYS is not set: secrets <in the clear>"
	e := newEnv(t, token, func(o *ops.Options) { o.Warnings = []string{warning} })
	escaped := "OUTBOX_SECRET_KEYS is not set: secrets &lt;in the clear&gt;"

	res, page := get(t, e.browser(t), e.srv.URL+"/ops/login")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NotContains(t, page, escaped, "the login page does not tell strangers about the configuration")

	c := e.loggedIn(t)
	for _, path := range []string{"/ops", "/ops/no-such-page"} {
		_, page := get(t, c, e.srv.URL+path)
		require.Contains(t, page, `<p class="alert banner" role="alert">`+escaped+`</p>`, "%s shows the warning, escaped", path)
	}

	plain := newEnv(t, token)
	_, page = get(t, plain.loggedIn(t), plain.srv.URL+"/ops")
	require.NotContains(t, page, "alert banner", "no warnings, no banner")
}
