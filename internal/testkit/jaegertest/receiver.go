package jaegertest

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver is an in-process OTLP/HTTP (protobuf) trace receiver: real OTLP
// over the wire, for the default suite, where Jaeger is not built. Its
// Trace returns spans in the form of Jaeger's query API.
type Receiver struct {
	// OTLPHTTP is its base URL (OTEL_EXPORTER_OTLP_ENDPOINT).
	OTLPHTTP string
	mu       sync.Mutex
	spans    []Span
}

// StartReceiver starts a Receiver, stopped when the test ends.
func StartReceiver(t testing.TB) *Receiver {
	r := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.OTLPHTTP = srv.URL
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.URL.Path != "/v1/traces" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.ResourceSpans {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, convert(s, service))
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// convert is s as Jaeger's query API shows it: attributes as tags, the
// kind as span.kind, an error status as otel.status_code ERROR.
func convert(s *tracepb.Span, service string) Span {
	sp := Span{TraceID: hex.EncodeToString(s.TraceId), SpanID: hex.EncodeToString(s.SpanId), OperationName: s.Name, Service: service}
	if len(s.ParentSpanId) > 0 {
		sp.References = append(sp.References, struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		}{"CHILD_OF", sp.TraceID, hex.EncodeToString(s.ParentSpanId)})
	}
	tag := func(k string, v any) {
		sp.Tags = append(sp.Tags, struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		}{k, v})
	}
	for _, a := range s.Attributes {
		tag(a.Key, value(a.Value))
	}
	if k := strings.TrimPrefix(s.Kind.String(), "SPAN_KIND_"); k != "INTERNAL" && k != "UNSPECIFIED" {
		tag("span.kind", strings.ToLower(k))
	}
	if s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		tag("otel.status_code", "ERROR")
		tag("otel.status_description", s.Status.Message)
	}
	return sp
}

func value(v *common.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *common.AnyValue_StringValue:
		return x.StringValue
	case *common.AnyValue_IntValue:
		return x.IntValue
	case *common.AnyValue_BoolValue:
		return x.BoolValue
	case *common.AnyValue_DoubleValue:
		return x.DoubleValue
	}
	return v.String()
}

// Trace returns the spans of trace id received so far (ErrNoTrace: none).
func (r *Receiver) Trace(_ context.Context, id string) ([]Span, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Span
	for _, s := range r.spans {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, ErrNoTrace
	}
	return out, nil
}
