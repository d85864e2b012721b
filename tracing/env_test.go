package tracing

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/walrelay/walrelay/sink"
)

// captureFD2 runs f with the process's file descriptor 2 (stderr) going to
// a file, and returns what was written to it: OpenTelemetry's default
// global logger writes to the os.Stderr of its init, so only the
// descriptor can be redirected.
func captureFD2(t *testing.T, f func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup2(int(tmp.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	f()
	_ = syscall.Dup2(saved, 2)
	_ = syscall.Close(saved)
	b, _ := os.ReadFile(tmp.Name())
	return string(b)
}

// TestOTLPSecretsNeverPrinted: an OTEL_EXPORTER_OTLP_*HEADERS or
// *ENDPOINT the exporter cannot read (HTTP's "Key: value" instead of
// key=value, a value that does not URL-unescape, a URL that does not
// parse) or holds credentials (user@, user:password@: the exporter keeps
// only the host, never sends them) stops New with an error naming the variable, and neither the
// error, walrelay's log nor stderr (OpenTelemetry's own logger) holds its
// value.
func TestOTLPSecretsNeverPrinted(t *testing.T) {
	tests := []struct{ name, key, value, secret string }{
		{"header with a colon", "OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer s3cr3t-colon", "s3cr3t-colon"},
		{"traces header with a colon", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key: s3cr3t-tcolon", "s3cr3t-tcolon"},
		{"header value not escaped", "OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Basic s3cr3t-esc%zz", "s3cr3t-esc"},
		{"header key not a token", "OTEL_EXPORTER_OTLP_HEADERS", "a=1,Bearer s3cr3t-key=x", "s3cr3t-key"},
		{"endpoint that does not parse", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:s3cr3t-url%zz@127.0.0.1:1", "s3cr3t-url"},
		{"traces endpoint that does not parse", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://user:s3cr3t-turl%zz@127.0.0.1:1/v1/traces", "s3cr3t-turl"},
		// Credentials in an endpoint: the exporter keeps only its host
		// (they are never sent), and a token as the user is not among the
		// secrets redacted from OpenTelemetry's errors.
		{"endpoint with a password", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:s3cr3t-pw@127.0.0.1:1", "s3cr3t-pw"},
		{"endpoint with a token", "OTEL_EXPORTER_OTLP_ENDPOINT", "https://s3cr3t-tok@127.0.0.1:1", "s3cr3t-tok"},
		{"traces endpoint with a token", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://s3cr3t-ttok@127.0.0.1:1/v1/traces", "s3cr3t-ttok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(tt.key, tt.value)
			var logs bytes.Buffer
			var err error
			out := captureFD2(t, func() {
				var tr *Tracing
				tr, err = New(t.Context(), Config{Enabled: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err == nil {
					_ = tr.Shutdown(t.Context())
				}
			})
			if err == nil {
				t.Errorf("%s=%q: walrelay started", tt.key, tt.value)
			} else if !strings.Contains(err.Error(), tt.key) || strings.Contains(err.Error(), tt.secret) {
				t.Errorf("error %q: want the variable %s named and not its value", err, tt.key)
			}
			for where, s := range map[string]string{"stderr": out, "the log": logs.String()} {
				if strings.Contains(s, tt.secret) {
					t.Errorf("%s's secret printed in %s: %q", tt.key, where, strings.TrimSpace(s))
				}
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", " Authorization=Bearer%20x , x-api-key=y,")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		tr, err := New(t.Context(), Config{Enabled: true})
		if err != nil {
			t.Fatal(err)
		}
		_ = tr.Shutdown(t.Context())
	})
}

// TestOpenTelemetryLogsCarryNoValues: once New ran, what OpenTelemetry
// reports through its global logger and error handler goes to walrelay's
// log, without the fields that hold configured values (input, value, key,
// url), and with the configured header values and endpoint redacted from
// error texts; nothing goes to stderr.
func TestOpenTelemetryLogsCarryNoValues(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20s3cr3t-hdr")
	var logs bytes.Buffer
	tr, err := New(t.Context(), Config{Enabled: true, Exporter: tracetest.NewInMemoryExporter(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(t.Context()) }()
	out := captureFD2(t, func() {
		otel.Handle(fmt.Errorf("export to %s: %w", "Bearer s3cr3t-hdr", errors.New("refused")))
		l := otelLogger(slog.New(slog.NewTextHandler(&logs, nil)))
		l.Error(errors.New(`parse "http://u:s3cr3t-hdr@x"`), "parse headers", "input", "Authorization: s3cr3t-hdr")
		l.V(1).Info("parse url", "url", "s3cr3t-hdr", "value", "s3cr3t-hdr")
	})
	if strings.Contains(out, "s3cr3t") || strings.Contains(logs.String(), "s3cr3t") {
		t.Errorf("a configured value printed: stderr %q, log %q", out, logs.String())
	}
	if !strings.Contains(logs.String(), "parse headers") || !strings.Contains(logs.String(), "refused") {
		t.Errorf("the reports are not in walrelay's log: %q", logs.String())
	}
}

// TestSamplerSettingRefused: an OTEL_TRACES_SAMPLER or
// OTEL_TRACES_SAMPLER_ARG the specification does not define stops New with
// an error naming the variable and the accepted values (the SDK would
// trace every event: a ratio it cannot read is 1.0, an unknown sampler
// parentbased_always_on); those it defines start, and a ratio samples as
// asked.
func TestSamplerSettingRefused(t *testing.T) {
	tests := []struct {
		sampler, arg string
		refused      string // the variable named in the error; "" starts
		maxSampled   int    // of 200 sampled writers' traces
	}{
		{"traceidratio", "0.01", "", 20},
		{"parentbased_traceidratio", "0.5", "", 200},
		{"TraceIdRatio", " 0 ", "", 0},
		{"traceidratio", "", "", 200},
		{"always_on", "", "", 200},
		{"always_off", "", "", 0},
		{"parentbased_always_on", "", "", 200},
		{"parentbased_always_off", "", "", 200},
		{"", "", "", 200},
		{"traceidratio", "1%", "OTEL_TRACES_SAMPLER_ARG", 0},
		{"traceidratio", "0,01", "OTEL_TRACES_SAMPLER_ARG", 0},
		{"parentbased_traceidratio", "2", "OTEL_TRACES_SAMPLER_ARG", 0},
		{"traceidratio", "-0.1", "OTEL_TRACES_SAMPLER_ARG", 0},
		{"traceidratio", "NaN", "OTEL_TRACES_SAMPLER_ARG", 0},
		{"always_of", "", "OTEL_TRACES_SAMPLER", 0},
		{"jaeger_remote", "endpoint=http://localhost:14250", "OTEL_TRACES_SAMPLER", 0},
		{"xray", "", "OTEL_TRACES_SAMPLER", 0},
	}
	for _, tt := range tests {
		t.Run(tt.sampler+"="+tt.arg, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_SAMPLER", tt.sampler)
			t.Setenv("OTEL_TRACES_SAMPLER_ARG", tt.arg)
			var (
				tr  *Tracing
				err error
			)
			out := captureFD2(t, func() {
				tr, err = New(t.Context(), Config{Enabled: true, Exporter: tracetest.NewInMemoryExporter()})
			})
			if tt.refused != "" {
				if err == nil {
					_ = tr.Shutdown(t.Context())
					t.Fatalf("OTEL_TRACES_SAMPLER=%s OTEL_TRACES_SAMPLER_ARG=%q: walrelay started", tt.sampler, tt.arg)
				}
				if msg := err.Error(); !strings.Contains(msg, tt.refused+"=") || !strings.Contains(msg, "parentbased_traceidratio") {
					t.Errorf("error %q: want %s named with the accepted values", msg, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("OTEL_TRACES_SAMPLER=%s OTEL_TRACES_SAMPLER_ARG=%q refused: %v", tt.sampler, tt.arg, err)
			}
			defer func() { _ = tr.Shutdown(t.Context()) }()
			if out != "" {
				t.Errorf("stderr: %q", out)
			}
			sampled := 0
			const n = 200
			for i := range n {
				tid := fmt.Sprintf("%032x", uint64(i+1)*0x9E3779B97F4A7C15)
				if _, end := tr.Publish(testEvent(), []byte("00-"+tid+"-"+writerSpan+"-01"), nil); end != nil {
					sampled++
					end(sink.Delivery{Topic: "orders"}, nil)
				}
			}
			if sampled > tt.maxSampled {
				t.Errorf("traced %d events of %d, want at most %d", sampled, n, tt.maxSampled)
			}
		})
	}
}

// TestKeyAttributeBounded: attribute values are cut at 256 bytes (a 1 MB
// aggregate id would make a 1 MB span, thousands of them queued while the
// collector is slow, and an OTLP request collectors refuse), unless
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT says otherwise.
func TestKeyAttributeBounded(t *testing.T) {
	tests := []struct{ env, value string }{{"", ""}, {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "1000"}, {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "1000"}}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			want := 256
			if tt.env != "" {
				t.Setenv(tt.env, tt.value)
				want = 1000
			}
			exp := tracetest.NewInMemoryExporter()
			tr, _ := newTest(t, exp, 0)
			e := testEvent()
			e.AggregateID = strings.Repeat("k", 1<<20)
			_, end := tr.Publish(e, []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil)
			if end == nil {
				t.Fatal("no span")
			}
			end(sink.Delivery{Topic: "orders", Partition: 0, Offset: 1}, nil)
			if err := tr.ForceFlush(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, s := range exp.GetSpans() {
				for _, a := range s.Attributes {
					if n := len(a.Value.String()); n > want {
						t.Errorf("span %q: attribute %s is %d bytes, want at most %d", s.Name, a.Key, n, want)
					}
				}
				if a := attrs(s); s.Name == "send orders" && len(a["messaging.kafka.message.key"].AsString()) != want {
					t.Errorf("key attribute of %d bytes, want the first %d", len(a["messaging.kafka.message.key"].AsString()), want)
				}
			}
		})
	}
}

// TestNonUTF8KeyLosesNoSpans: an aggregate id that is not UTF-8 (a
// SQL_ASCII database sends its text as it is) is left out of the span,
// whose string attributes protobuf would refuse: the OTLP exporter would
// fail the whole request, losing every other event's spans with it.
func TestNonUTF8KeyLosesNoSpans(t *testing.T) {
	var (
		mu  sync.Mutex
		got int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err == nil {
			mu.Lock()
			for _, rs := range req.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					got += len(ss.Spans)
				}
			}
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ = proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	tr, err := New(t.Context(), Config{Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tr.Shutdown(t.Context()) }()
	const n = 10
	for i := range n {
		e := testEvent()
		e.Index = i
		if i == 5 {
			e.AggregateID, e.ID, e.Source = "order-\xff\xfe", "id-\xff", "public.out\xffbox"
		}
		_, end := tr.Publish(e, []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil)
		d := sink.Delivery{Topic: "orders", Partition: 0, Offset: int64(i)}
		var err error
		if i == 5 {
			d.Topic, err = "orders-\xff", errors.New("invalid topic \xff")
		}
		end(d, err)
	}
	if err := tr.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		g := got
		mu.Unlock()
		if g == 2*n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector received %d spans of %d (dropped: %d): one event's text that is not UTF-8 lost the batch", g, 2*n, tr.Dropped())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUnsampledEventAllocatesNothing: under a parent-based sampler (the
// default), an event whose writer did not sample its trace (99% of them
// under a 1% writer sampler) costs Publish no allocation.
func TestUnsampledEventAllocatesNothing(t *testing.T) {
	tr, _ := newTest(t, tracetest.NewInMemoryExporter(), 0)
	e := testEvent()
	parent := []byte("00-" + writerTrace + "-" + writerSpan + "-00")
	if n := testing.AllocsPerRun(1000, func() { tr.Publish(e, parent, nil) }); n != 0 {
		t.Errorf("%v allocations per event of an unsampled trace", n)
	}
}

// TestRetriedEventOneWALWait: an event published again after a failed
// publish has one WAL wait span, from its commit to its first publish.
func TestRetriedEventOneWALWait(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, _ := newTest(t, exp, 0)
	e := testEvent()
	_, end := tr.Publish(e, []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil)
	end(sink.Delivery{Topic: "orders", Partition: -1}, errors.New("broker down"))
	_, end = tr.Publish(e, []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil)
	end(sink.Delivery{Topic: "orders", Partition: 0, Offset: 7}, nil)
	if err := tr.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	waits := 0
	for _, s := range exp.GetSpans() {
		if s.Name == SpanWALWait {
			waits++
		}
	}
	if waits != 1 {
		t.Errorf("%d %q spans for one event published twice", waits, SpanWALWait)
	}
}
