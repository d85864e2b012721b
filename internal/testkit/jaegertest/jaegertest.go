// Package jaegertest runs a real Jaeger (v2, the all-in-one binary built on
// OpenTelemetry's collector, storing in memory and receiving OTLP) for the
// tests of walrelay's tracing, and reads traces back from its query API.
//
// The binary is built from the tools/jaeger module (a module of its own,
// so that Jaeger's hundreds of dependencies stay out of walrelay's go.sum)
// into a cache directory on first use.
package jaegertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/freeport"
)

// Version is the Jaeger release tools/jaeger/go.mod pins.
const Version = "v1.75.0"

// Env gates the tests against a real Jaeger: "1" runs them.
const Env = "WALRELAY_TEST_JAEGER"

// Jaeger is a running Jaeger.
type Jaeger struct {
	// OTLPHTTP is the base URL of its OTLP/HTTP receiver (the value of
	// OTEL_EXPORTER_OTLP_ENDPOINT), Query that of its query API.
	OTLPHTTP, Query string
}

// Binary returns the path of the Jaeger binary, building it the first time
// into the cache directory (WALRELAY_JAEGER_CACHE, default
// ~/.cache/walrelay/jaeger-<version>).
func Binary(ctx context.Context) (string, error) {
	dir := os.Getenv("WALRELAY_JAEGER_CACHE")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("jaegertest: no cache directory: %w", err)
		}
		dir = filepath.Join(home, ".cache", "walrelay", "jaeger-"+Version)
	}
	bin := filepath.Join(dir, "jaeger")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("jaegertest: %w", err)
	}
	_, here, _, _ := runtime.Caller(0)
	mod := filepath.Join(filepath.Dir(here), "..", "..", "..", "tools", "jaeger")
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, "github.com/jaegertracing/jaeger/cmd/jaeger")
	cmd.Dir = mod
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("jaegertest: build Jaeger %s in %s: %w\n%s", Version, mod, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("jaegertest: %w", err)
	}
	return bin, nil
}

// freePort is a TCP port free on the loopback interface a moment ago.
func freePort() (int, error) { return freeport.One() }

// config is Jaeger's configuration: OTLP/HTTP in, memory storage, the query
// API, on the ports given; no metrics or other listeners of its own.
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// Start builds (first time) and starts Jaeger on free ports, waits until it
// answers, and stops it when the test ends.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin, err := Binary(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, ports[0], ports[1], ports[2]), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "jaeger.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("jaeger's log:\n%s", b)
		}
	})
	j := &Jaeger{OTLPHTTP: fmt.Sprintf("http://127.0.0.1:%d", ports[2]), Query: fmt.Sprintf("http://127.0.0.1:%d", ports[0])}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(j.Query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("jaeger exited: %v\n%s", err, b)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("jaeger does not answer after a minute")
		}
	}
}

// Span is a span as Jaeger's query API returns it.
type Span struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
	ProcessID string `json:"processID"`
	// Service is the service name of the span's process.
	Service string `json:"-"`
}

// Tag is the value of the span's tag key, as text; "" if none.
func (s Span) Tag(key string) string {
	for _, t := range s.Tags {
		if t.Key == key {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// ErrNoTrace is Trace's error while Jaeger has no such trace.
var ErrNoTrace = errors.New("no such trace")

// Trace returns the spans of trace id (32 hex digits).
func (j *Jaeger) Trace(ctx context.Context, id string) ([]Span, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/traces/"+id, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, ErrNoTrace
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/traces/%s: %s: %s", id, resp.Status, strings.TrimSpace(string(body)))
	}
	var out struct {
		Data []struct {
			Spans     []Span `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("GET /api/traces/%s: %w", id, err)
	}
	if len(out.Data) == 0 {
		return nil, ErrNoTrace
	}
	spans := out.Data[0].Spans
	for i := range spans {
		spans[i].Service = out.Data[0].Processes[spans[i].ProcessID].ServiceName
	}
	return spans, nil
}
