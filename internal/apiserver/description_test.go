package apiserver_test

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/orders/openapi"
)

// The description names every route the muxes register, and only those:
// read from the registrations (registeredRoutes), not from a list, so a
// route added without its description, or a description left for a route
// removed, fails here. A pattern without a method is not a route: it hands
// a path or a subtree to another handler (a mux whose own routes are read
// here; River UI, an application of its own under /ops/jobs; the ops
// page's not-found page). A method's subtree pattern ("GET /ops/static/")
// is described by its prefix and one path parameter.
func TestEveryRouteIsDescribed(t *testing.T) {
	t.Parallel()
	param := regexp.MustCompile(`\{[^}$]*\}`)
	var registered []string
	for _, pattern := range registeredRoutes(t) {
		method, path, found := strings.Cut(pattern, " ")
		if !found {
			continue // a mount
		}
		if strings.HasSuffix(path, "/") {
			path += "{}" // a subtree
		}
		path = strings.ReplaceAll(path, "{$}", "")
		registered = append(registered, method+" "+param.ReplaceAllString(path, "{}"))
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(openapi.Description, &doc))
	var described []string
	for path, item := range doc.Paths {
		for method := range item {
			if method == "parameters" || method == "summary" || method == "description" {
				continue
			}
			described = append(described, strings.ToUpper(method)+" "+param.ReplaceAllString(path, "{}"))
		}
	}
	slices.Sort(registered)
	slices.Sort(described)
	require.Contains(t, registered, "POST /webhook-endpoints", "the routes are read from the muxes' registrations")
	require.Equal(t, registered, described, "openapi/openapi.yaml describes the routes registered, and no other")
}

// GET /openapi.yaml serves the description, to anyone: it holds no
// secret, and a client's generator fetches it from the running api.
func TestTheDescriptionIsServed(t *testing.T) {
	t.Parallel()
	s := setup(t, map[string]string{"ADMIN_TOKEN": adminToken})
	resp, body := send(t, http.MethodGet, s.url+"/openapi.yaml", nil, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, openapi.MediaType, resp.Header.Get("Content-Type"))
	require.Equal(t, openapi.Description, body, "the description as committed")
}
