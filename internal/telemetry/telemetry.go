// Package telemetry sets up OpenTelemetry tracing at a process's edge: it
// reads the standard OTEL_* variables (through the process's getenv, like
// every other setting), and only when an exporter is configured installs a
// tracer provider and the W3C propagator. Without one nothing is installed,
// the global provider stays OpenTelemetry's no-op, and the process runs
// exactly as it would without this package.
//
// Variables read here:
//
//	OTEL_TRACES_EXPORTER                otlp | console | none (unset: otlp when an endpoint is set)
//	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  full URL of the traces endpoint (http://collector:4318/v1/traces)
//	OTEL_EXPORTER_OTLP_ENDPOINT         base URL; /v1/traces is appended
//	OTEL_EXPORTER_OTLP_PROTOCOL         only http/protobuf is supported
//	OTEL_SERVICE_NAME                   defaults to the process's name (orders-api, orders-worker)
//	OTEL_SDK_DISABLED                   true turns tracing off whatever else is set
//
// The OpenTelemetry SDK itself still honours its other standard variables
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, OTEL_BSP_*) from the
// process environment.
package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/orders/internal/process"
)

// Exporters.
const (
	ExporterOTLP    = "otlp"
	ExporterConsole = "console"
	ExporterNone    = "none"
)

// Config is the tracing a process was asked for.
type Config struct {
	// Exporter is ExporterOTLP, ExporterConsole, or "" for tracing off.
	Exporter string
	// Endpoint is the OTLP/HTTP traces URL; "" means the SDK's default
	// (http://localhost:4318/v1/traces).
	Endpoint string
	// ServiceName names the process in its traces.
	ServiceName string
}

// Enabled reports whether an exporter is configured.
func (c Config) Enabled() bool { return c.Exporter != "" }

// FromEnv reads the tracing configuration. Problems are recorded on env,
// naming their variable, like every other setting.
func FromEnv(env *process.Env, defaultService string) Config {
	c := Config{ServiceName: env.String("OTEL_SERVICE_NAME", defaultService)}
	if env.Bool("OTEL_SDK_DISABLED", false) {
		return Config{}
	}
	if p := env.String("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"); p != "http/protobuf" {
		env.Fail("OTEL_EXPORTER_OTLP_PROTOCOL", fmt.Errorf("only http/protobuf is supported, got %q", p))
	}
	if u := env.String("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""); u != "" {
		c.Endpoint = checkURL(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", u)
	} else if u := env.String("OTEL_EXPORTER_OTLP_ENDPOINT", ""); u != "" {
		if base := checkURL(env, "OTEL_EXPORTER_OTLP_ENDPOINT", u); base != "" {
			c.Endpoint = strings.TrimSuffix(base, "/") + "/v1/traces"
		}
	}
	switch exp := env.String("OTEL_TRACES_EXPORTER", ""); exp {
	case "":
		if c.Endpoint != "" {
			c.Exporter = ExporterOTLP
		}
	case ExporterOTLP, ExporterConsole:
		c.Exporter = exp
	case ExporterNone:
	default:
		env.Fail("OTEL_TRACES_EXPORTER", fmt.Errorf("want one of otlp, console or none, got %q", exp))
	}
	return c
}

func checkURL(env *process.Env, name, v string) string {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		env.Fail(name, fmt.Errorf("want an http(s) URL such as http://collector:4318, got %q", v))
		return ""
	}
	return v
}

// Tracing is a process's tracing, on or off.
type Tracing struct {
	// Provider is the tracer provider, or nil when tracing is off.
	Provider trace.TracerProvider
	sdk      *sdktrace.TracerProvider
	logger   *slog.Logger
}

// Setup installs tracing as cfg asks: with an exporter, a tracer provider
// (batching spans to it) and the W3C trace-context and baggage propagator
// become OpenTelemetry's globals; without one nothing is installed. Console
// spans go to stdout. Export errors are logged, never fatal.
func Setup(ctx context.Context, cfg Config, stdout io.Writer, logger *slog.Logger) (*Tracing, error) {
	if !cfg.Enabled() {
		return &Tracing{}, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	switch cfg.Exporter {
	case ExporterConsole:
		exp, err = stdouttrace.New(stdouttrace.WithWriter(stdout))
	default:
		var opts []otlptracehttp.Option
		if cfg.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(cfg.Endpoint))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("creating %s trace exporter: %w", cfg.Exporter, err)
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", cfg.ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("describing the service for traces: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("opentelemetry", slog.String("error", err.Error()))
	}))
	logger.InfoContext(ctx, "tracing on", slog.String("exporter", cfg.Exporter),
		slog.String("endpoint", cfg.Endpoint), slog.String("service", cfg.ServiceName))
	return &Tracing{Provider: tp, sdk: tp, logger: logger}, nil
}

// Shutdown flushes the spans still buffered, for up to 5 seconds, and logs
// what it could not export: losing spans never fails a process's exit. A
// no-op when tracing is off.
func (t *Tracing) Shutdown(ctx context.Context) {
	if t == nil || t.sdk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := t.sdk.Shutdown(ctx); err != nil {
		t.logger.WarnContext(ctx, "flushing traces", slog.String("error", err.Error()))
	}
}

// Handler traces the requests h serves (a server span each, continuing the
// caller's traceparent), named by method and route pattern. Health and
// metrics probes are not traced. With tracing off h is returned as it is.
func (t *Tracing) Handler(h http.Handler) http.Handler {
	if t == nil || t.Provider == nil {
		return h
	}
	return otelhttp.NewHandler(h, "http.server",
		otelhttp.WithTracerProvider(t.Provider),
		otelhttp.WithPropagators(otel.GetTextMapPropagator()),
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				return false
			}
			return true
		}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern != "" {
				// ServeMux patterns may carry the method already ("GET /healthz").
				if strings.HasPrefix(r.Pattern, r.Method+" ") {
					return r.Pattern
				}
				return r.Method + " " + r.Pattern
			}
			return r.Method
		}),
	)
}
