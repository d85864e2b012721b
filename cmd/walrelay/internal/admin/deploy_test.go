package admin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
)

// deployExprs returns every PromQL expression of the Grafana dashboards and
// the Prometheus rules under deploy/.
func deployExprs(t *testing.T) []string {
	t.Helper()
	var exprs []string
	dashboards, _ := filepath.Glob("../../../../deploy/grafana/*.json")
	rules, _ := filepath.Glob("../../../../deploy/prometheus/*.yml")
	if len(dashboards) == 0 || len(rules) == 0 {
		t.Fatalf("dashboards %v, rules %v: want both", dashboards, rules)
	}
	for _, f := range dashboards {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Title   string
				Targets []struct{ Expr string }
			}
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Fatalf("%s: panel %q has no query", f, p.Title)
			}
			for _, x := range p.Targets {
				exprs = append(exprs, x.Expr)
			}
		}
	}
	for _, f := range rules {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Groups []struct {
				Rules []struct{ Alert, Expr string }
			}
		}
		if err := yaml.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range r.Groups {
			for _, x := range g.Rules {
				exprs = append(exprs, x.Expr)
			}
		}
	}
	return exprs
}

// TestDeployFilesNameServedMetrics: every metric a dashboard panel or an
// alert rule names is one walrelay's /metrics serves (its registry, with
// every labelled metric touched once so that it is exposed).
func TestDeployFilesNameServedMetrics(t *testing.T) {
	m := New()
	r, err := relay.New(relay.Config{ConnString: "postgres://u@127.0.0.1:1/db", Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	m.Register(r)
	h := m.Hooks()
	h.Acked("public.outbox", "t", "", time.Now())
	h.Acked("public.outbox", "", "too_large", time.Now())
	h.PublishError("transient")
	h.Ignored("update")
	commit, abort := m.TransactionHooks()
	commit(event.Position{CommitLSN: 1}, time.Millisecond)
	abort()
	m.slotSafe.WithLabelValues().Set(1)
	// Source poll's metrics.
	ph := m.PollHooks()
	ph.Claimed("public.outbox", 1, 0, time.Millisecond)
	ph.Marked("public.outbox", time.Millisecond, 1, 0, 0, 0)
	m.pollRows.WithLabelValues("public.outbox", "due").Set(0)
	m.pollAge.WithLabelValues("public.outbox").Set(0)
	// Tracing's (tracing.enabled).
	m.RegisterTracing(func() uint64 { return 0 })
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, f := range families {
		served[f.GetName()] = true
	}
	name := regexp.MustCompile(`\b(?:walrelay|process|go)_[a-z0-9_]+`)
	n := 0
	for _, e := range deployExprs(t) {
		for _, metric := range name.FindAllString(e, -1) {
			base := metric
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(metric, suffix); ok && served[b] {
					base = b
				}
			}
			if !served[base] {
				t.Errorf("%q names %s, which walrelay does not serve", e, metric)
			}
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d metric names found in the deploy files", n)
	}
}
