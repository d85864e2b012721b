package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/walrelay/walrelay/internal/noredirect"
)

// DefaultAttributeValueLengthLimit bounds the length of walrelay's span
// attribute values (the aggregate id as messaging.kafka.message.key) when
// neither OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT nor
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT is set.
const DefaultAttributeValueLengthLimit = 256

// samplers are the values of OTEL_TRACES_SAMPLER walrelay accepts: the
// specification's, but for jaeger_remote and xray, which need SDK
// extensions walrelay does not hold.
const samplers = "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio (the default)"

// checkOTLPEnv refuses the OTEL_EXPORTER_OTLP_* headers and endpoints the
// exporter could not read: the exporter would log them, value and all,
// through OpenTelemetry's global logger, and go on without them. So is an
// endpoint with credentials (user@, user:password@): the exporter keeps
// only its host and never sends them. The
// error names the variable, never its value (a header holds credentials,
// an endpoint may hold a password).
func checkOTLPEnv() error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		if err := checkHeaders(os.Getenv(name)); err != nil {
			return fmt.Errorf("tracing: %s (value not shown): %w", name, err)
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if v := os.Getenv(name); v != "" {
			u, err := url.Parse(v)
			if err != nil {
				return fmt.Errorf("tracing: %s (value not shown): not a URL", name)
			}
			if u.User != nil {
				return fmt.Errorf("tracing: %s (value not shown): holds credentials (user@ or user:password@), which the exporter never sends (it keeps the host) and errors could print: give them as a header in OTEL_EXPORTER_OTLP_HEADERS (Authorization=Basic%%20...)", name)
			}
		}
	}
	return nil
}

// otlpHTTPClient is the client the OTLP/HTTP exporter would build from
// the environment, refusing every redirect (noredirect.Client).
//
// Why a client of walrelay's: the exporter offers no way to wrap its own.
// Its WithProxy option (a Proxy function that refuses a redirected
// request) is not enough: over HTTP/2 Go's transport sends a redirect to
// the same host and port on the connection already open, without asking
// Proxy. WithHTTPClient replaces, in the client the exporter builds
// (otlptracehttp v1.47.0's NewClient), exactly the TLS configuration
// (OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE, _CLIENT_CERTIFICATE and
// _CLIENT_KEY), the timeout (OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT) and the
// proxy (the environment's): so these are read here as its
// internal/otlpconfig reads them, the TRACES_ one winning, and what cannot
// be read is skipped as the exporter skips it (the exporter still reads
// them too, and logs that). Everything else (endpoint, headers,
// compression, OTEL_EXPORTER_OTLP_[TRACES_]INSECURE, and the refusal of
// an insecure endpoint with TLS settings) the exporter still does itself.
func otlpHTTPClient() *http.Client {
	return noredirect.Client(otlpTransport(), otlpTimeout())
}

// otlpEnv is OTEL_EXPORTER_OTLP_<name>, trimmed.
func otlpEnv(name string) string {
	return strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_" + name))
}

// otlpTransport is the exporter's transport (a copy of
// http.DefaultTransport's settings, HTTP/2 included) with the TLS of
// the environment.
func otlpTransport() *http.Transport {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
	cfg := &tls.Config{}
	for _, prefix := range []string{"", "TRACES_"} {
		if pem, err := os.ReadFile(otlpEnv(prefix + "CERTIFICATE")); err == nil {
			if pool := x509.NewCertPool(); pool.AppendCertsFromPEM(pem) {
				cfg.RootCAs = pool
			}
		}
		certFile, keyFile := otlpEnv(prefix+"CLIENT_CERTIFICATE"), otlpEnv(prefix+"CLIENT_KEY")
		if certFile != "" && keyFile != "" {
			if cert, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil {
				cfg.Certificates = []tls.Certificate{cert}
			}
		}
	}
	if cfg.RootCAs != nil || len(cfg.Certificates) > 0 {
		tr.TLSClientConfig = cfg
	}
	return tr
}

// otlpTimeout is the exporter's timeout of one export: milliseconds, 10s
// by default. (Zero or less: none, as http.Client takes it.)
func otlpTimeout() time.Duration {
	d := 10 * time.Second
	for _, name := range []string{"TIMEOUT", "TRACES_TIMEOUT"} {
		if ms, err := strconv.Atoi(otlpEnv(name)); err == nil {
			d = time.Duration(ms) * time.Millisecond
		}
	}
	return d
}

// checkHeaders checks v as the OTLP exporter reads it: comma-separated
// key=value pairs, each key an HTTP token and each value URL-escaped.
func checkHeaders(v string) error {
	for i, pair := range strings.Split(v, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, val, ok := strings.Cut(pair, "=")
		switch {
		case !ok:
			return fmt.Errorf("entry %d is not key=value (HTTP's \"Key: value\" is not the format)", i+1)
		case !isToken(strings.TrimSpace(k)):
			return fmt.Errorf("entry %d: the key is not an HTTP header name", i+1)
		}
		if _, err := url.PathUnescape(val); err != nil {
			return fmt.Errorf("entry %d: the value is not URL-escaped (write %% as %%25, a space as %%20)", i+1)
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110), as a header name
// must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// samplerFromEnv is the sampler of OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG (parentbased_always_on when unset), and whether
// it follows the parent's sampled flag. Unlike the SDK, which traces every
// event when it cannot read them (a ratio of 1.0, or its default), it
// refuses what it cannot read.
func samplerFromEnv() (s sdktrace.Sampler, parentBased bool, err error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || math.IsNaN(r) || r < 0 || r > 1 {
			return nil, fmt.Errorf("tracing: OTEL_TRACES_SAMPLER_ARG=%q: want a ratio from 0 to 1 (0.01 for 1%%) for OTEL_TRACES_SAMPLER=%s (accepted samplers: %s)", arg, name, samplers)
		}
		return sdktrace.TraceIDRatioBased(r), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), true, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), true, nil
	case "always_on":
		return sdktrace.AlwaysSample(), false, nil
	case "always_off":
		return sdktrace.NeverSample(), false, nil
	case "traceidratio":
		s, err := ratio()
		return s, false, err
	case "parentbased_traceidratio":
		s, err := ratio()
		if err != nil {
			return nil, false, err
		}
		return sdktrace.ParentBased(s), true, nil
	case "jaeger_remote", "parentbased_jaeger_remote", "xray":
		return nil, false, fmt.Errorf("tracing: OTEL_TRACES_SAMPLER=%s is not supported by walrelay: accepted samplers: %s", name, samplers)
	}
	return nil, false, fmt.Errorf("tracing: OTEL_TRACES_SAMPLER=%q is not a sampler: accepted samplers: %s", name, samplers)
}

// spanLimits are the SDK's limits from the OTEL_*_LIMIT variables, with
// attribute values bounded to DefaultAttributeValueLengthLimit unless a
// variable sets their limit.
func spanLimits() sdktrace.SpanLimits {
	l := sdktrace.NewSpanLimits()
	if os.Getenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" && os.Getenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" {
		l.AttributeValueLengthLimit = DefaultAttributeValueLengthLimit
	}
	return l
}

// routeOTelLogs sends what OpenTelemetry reports through its global
// logger and error handler to log instead of stderr: the logger's
// messages without their error and fields (the exporter's env parser puts
// the raw header or URL in them), the handler's errors with the
// configured header values and endpoints redacted.
func routeOTelLogs(log *slog.Logger) {
	otel.SetLogger(otelLogger(log))
	secrets := otlpSecrets()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry: " + redact(err.Error(), secrets))
	}))
}

// otlpSecrets are the values redacted from OpenTelemetry's errors: the
// OTLP headers' values, and the endpoints with their passwords.
func otlpSecrets() []string {
	var out []string
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		for pair := range strings.SplitSeq(os.Getenv(name), ",") {
			if _, v, ok := strings.Cut(pair, "="); ok {
				out = append(out, strings.TrimSpace(v))
				if u, err := url.PathUnescape(v); err == nil {
					out = append(out, strings.TrimSpace(u))
				}
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		v := os.Getenv(name)
		out = append(out, v)
		if u, err := url.Parse(v); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
		}
	}
	return out
}

// redact replaces each secret (of 4 bytes or more) in s.
func redact(s string, secrets []string) string {
	for _, x := range secrets {
		if len(x) >= 4 {
			s = strings.ReplaceAll(s, x, "[redacted]")
		}
	}
	return s
}

// otelLogger is the logr.Logger given to OpenTelemetry: warnings and
// errors (verbosity 1 and below) go to log as warnings, with their message
// only.
func otelLogger(log *slog.Logger) logr.Logger {
	return logr.New(msgSink{log: log})
}

// msgSink is a logr.LogSink that keeps a record's message and drops its
// error and key/value pairs, which may hold configured values.
type msgSink struct {
	log  *slog.Logger
	name string
}

func (msgSink) Init(logr.RuntimeInfo)  {}
func (msgSink) Enabled(level int) bool { return level <= 1 }
func (s msgSink) Info(_ int, msg string, _ ...any) {
	s.log.Log(context.Background(), slog.LevelWarn, "opentelemetry: "+s.name+msg)
}

func (s msgSink) Error(_ error, msg string, _ ...any) {
	s.log.Log(context.Background(), slog.LevelWarn, "opentelemetry: "+s.name+msg+" (the error and its values are not shown: they may hold an OTEL_* setting's value)")
}
func (s msgSink) WithValues(...any) logr.LogSink { return s }
func (s msgSink) WithName(name string) logr.LogSink {
	s.name += name + ": "
	return s
}
