package process

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A service names itself after its own module path, so a copy of the
// template never introduces itself as the template.
func TestNameIsTheModulePathsLastElement(t *testing.T) {
	t.Parallel()
	for mod, want := range map[string]string{
		"github.com/example/orders":    "orders",
		"example.com/acme/Shop_API":    "shop-api",
		"example.com/acme/payments/v2": "payments",
		"payments":                     "payments",
		"":                             "service",
		"example.com/__":               "service",
	} {
		require.Equal(t, want, nameOf(mod), "the name of module %q", mod)
	}
	// The test binary is built from this module: its name is the module's,
	// in a copy too.
	gomod, err := os.ReadFile("../../go.mod")
	require.NoError(t, err)
	mod, _, _ := strings.Cut(strings.TrimPrefix(string(gomod), "module "), "\n")
	require.Equal(t, nameOf(mod), Name(), "the name of the module built, %s", mod)
	require.Equal(t, Name()+"-relay/1", UserAgent())
}
