package main

import "text/template"

func mustTemplate() *template.Template {
	return template.Must(template.New("migration").Parse(`-- +goose Up
-- Each module owns its tables; name them after the module (e.g. payments_*).

-- +goose Down
`))
}
