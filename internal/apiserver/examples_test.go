package apiserver_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/orders/openapi"
)

// The description's request examples work: each, sent as it is written
// (the path's {id} the endpoint the example made), is answered with
// success by the api cmd/dev runs, and the exchange is valid against the
// description like every other.
func TestTheDescriptionsExamplesWork(t *testing.T) {
	t.Parallel()
	a := setupAdmin(t)
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `yaml:"operationId"`
			RequestBody struct {
				Content map[string]struct {
					Example any `yaml:"example"`
				} `yaml:"content"`
			} `yaml:"requestBody"`
		} `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(openapi.Description, &doc))
	type example struct{ method, path, body string }
	examples := map[string]example{}
	for path, item := range doc.Paths {
		for method, op := range item {
			if ex := op.RequestBody.Content["application/json"].Example; ex != nil {
				b, err := json.Marshal(ex)
				require.NoError(t, err)
				examples[op.OperationID] = example{strings.ToUpper(method), path, string(b)}
			}
		}
	}
	var endpoint string
	for _, id := range []string{"placeOrder", "createEndpoint", "updateEndpoint", "rotateSecret", "replayEvents"} {
		ex, ok := examples[id]
		require.True(t, ok, "%s has a request example", id)
		headers := map[string]string{"Content-Type": "application/json"}
		if !strings.HasPrefix(ex.path, "/orders") {
			headers = a.auth
		}
		resp, body := send(t, ex.method, a.s.url+strings.ReplaceAll(ex.path, "{id}", endpoint), headers, ex.body)
		require.Less(t, resp.StatusCode, 300, "%s's example: %s", id, body)
		if id == "createEndpoint" {
			endpoint = decodeEndpoint(t, body).ID
		}
	}
}
