// Package openapi is the service's contract as tools read it: openapi.yaml,
// the OpenAPI 3.1 description of every route of the api and of the
// webhooks it sends, whose data schemas are the event catalog's.
//
// The api serves it at GET /openapi.yaml. Tests hold it true: every
// route registered is described and every route described is registered,
// every exchange the API tests make is valid against it, its webhooks are
// the catalog's types, and every event the tests emit is valid against
// its type's schema. A receiver reads an event's schema from it
// (EventSchema).
package openapi

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Description is openapi.yaml.
//
//go:embed openapi.yaml
var Description []byte

// MediaType is the description's media type (RFC 9512).
const MediaType = "application/yaml"

// ErrUnknownEventType is returned by EventSchema for a type the
// description has no webhook for.
var ErrUnknownEventType = errors.New("api: no such event type in the description")

// webhook is the part of a webhook's description that says what its
// events' data holds.
type webhook struct {
	Post struct {
		Version     int `yaml:"x-event-version"`
		RequestBody struct {
			Content map[string]struct {
				Schema struct {
					Properties struct {
						Data any `yaml:"data"`
					} `yaml:"properties"`
				} `yaml:"schema"`
			} `yaml:"content"`
		} `yaml:"requestBody"`
	} `yaml:"post"`
}

// EventSchema returns the JSON Schema of the data of events of type typ
// as the description publishes it (its webhook's body's data), and the
// type's version.
func EventSchema(typ string) (schema json.RawMessage, version int, err error) {
	var doc struct {
		Webhooks map[string]webhook `yaml:"webhooks"`
	}
	if err := yaml.Unmarshal(Description, &doc); err != nil {
		return nil, 0, fmt.Errorf("reading the description: %w", err)
	}
	w, ok := doc.Webhooks[typ]
	if !ok {
		return nil, 0, fmt.Errorf("%w: %q", ErrUnknownEventType, typ)
	}
	data := w.Post.RequestBody.Content["application/json"].Schema.Properties.Data
	if data == nil {
		return nil, 0, fmt.Errorf("reading the description: webhook %q has no data schema", typ)
	}
	b, err := json.Marshal(data)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the description: webhook %q: %w", typ, err)
	}
	return b, w.Post.Version, nil
}
