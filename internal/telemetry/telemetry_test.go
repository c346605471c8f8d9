package telemetry_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/orders/internal/process"
	"github.com/outboxkit/orders/internal/telemetry"
)

func TestFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want telemetry.Config
		bad  string // the variable an error must name
	}{
		{"nothing set: off", nil, telemetry.Config{ServiceName: "svc"}, ""},
		{"base endpoint: otlp to /v1/traces", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
			telemetry.Config{Exporter: "otlp", Endpoint: "http://collector:4318/v1/traces", ServiceName: "svc"}, ""},
		{"traces endpoint as given", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b/traces"},
			telemetry.Config{Exporter: "otlp", Endpoint: "https://b/traces", ServiceName: "svc"}, ""},
		{"otlp with the default endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"},
			telemetry.Config{Exporter: "otlp", ServiceName: "svc"}, ""},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "x"},
			telemetry.Config{Exporter: "console", ServiceName: "x"}, ""},
		{"none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"},
			telemetry.Config{Endpoint: "http://a:4318/v1/traces", ServiceName: "svc"}, ""},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, telemetry.Config{}, ""},
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, telemetry.Config{}, "OTEL_TRACES_EXPORTER"},
		{"endpoint without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, telemetry.Config{}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, telemetry.Config{}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := process.NewEnv(func(k string) string { return tc.env[k] })
			got := telemetry.FromEnv(env, "svc")
			if tc.bad != "" {
				require.ErrorContains(t, env.Err(), tc.bad)
				return
			}
			require.NoError(t, env.Err())
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.want.Exporter != "", got.Enabled())
		})
	}
}

// Off means the handler is returned untouched: not even a wrapper.
func TestHandlerUntouchedWhenOff(t *testing.T) {
	t.Parallel()
	h := http.NewServeMux()
	tr := &telemetry.Tracing{}
	require.Same(t, h, tr.Handler(h))
	rec := httptest.NewRecorder()
	tr.Handler(h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusNotFound, rec.Code)
}
