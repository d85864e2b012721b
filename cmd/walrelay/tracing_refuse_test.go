package main

import (
	"strings"
	"testing"
)

// TestTracingRefusesUnreadableOTLPSettings: walrelay run refuses to start
// on an OTEL_EXPORTER_OTLP_HEADERS, endpoint or sampler setting the SDK
// cannot read, or an endpoint with credentials (which the exporter never
// sends), naming the variable; its output (stderr, where the SDK's
// own logger wrote the raw header before) never shows the value.
func TestTracingRefusesUnreadableOTLPSettings(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	const secret = "s3cret-token"
	for _, c := range []struct{ key, value string }{
		{"OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer " + secret},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:" + secret + "%zz@127.0.0.1:4318"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://" + secret + "@127.0.0.1:4318"}, // credentials: never sent, refused
		{"OTEL_TRACES_SAMPLER_ARG", "1%"},
	} {
		e := baseEnv(pg, kc).with("WALRELAY_TRACING_ENABLED", "true", "OTEL_TRACES_SAMPLER", "parentbased_traceidratio", c.key, c.value)
		code, out := runCmd(t, e, "run")
		if code == 0 || !strings.Contains(out, c.key) {
			t.Errorf("%s: run exit %d, want a refusal naming it:\n%s", c.key, code, tail(out, 1500))
		}
		if strings.Contains(out, secret) {
			t.Errorf("%s: the output shows its secret:\n%s", c.key, out)
		}
	}
}
