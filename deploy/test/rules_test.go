package test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// TestAlertRules evaluates each rule of deploy/prometheus with Prometheus's
// own rule evaluation (what promtool test rules runs), minute by minute
// over series that must make it fire and over series that must not: the
// rules parse, their for: holds, and each fires for what it is named after.
func TestAlertRules(t *testing.T) {
	p := parser.NewParser(promqltest.TestParserOpts)
	log := slog.New(slog.DiscardHandler)
	groups, errs := rulefmt.ParseFile("../prometheus/walrelay-rules.yml", false, model.UTF8Validation, p, log)
	if len(errs) > 0 {
		t.Fatalf("rules: %v", errs)
	}
	byName := map[string]rulefmt.Rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			byName[r.Alert] = r
		}
	}
	cases := []struct {
		alert, series string
		minutes       int
		fires         bool
	}{
		{"WalrelaySlotNearInvalidation", `walrelay_slot_safe_wal_bytes{job="w"} 10e9-1e9x15`, 15, true},
		{"WalrelaySlotNearInvalidation", `walrelay_slot_safe_wal_bytes{job="w"} 50e9x15`, 15, false},
		{"WalrelaySlotNearInvalidation", `walrelay_slot_lag_bytes{job="w"} 0x15`, 15, false}, // unlimited: absent
		{"WalrelayRetainedWALHigh", `walrelay_slot_retained_wal_bytes{job="w"} 0+5e9x30`, 30, true},
		{"WalrelayRetainedWALHigh", `walrelay_slot_retained_wal_bytes{job="w"} 0+5e9x30`, 10, false}, // over 20 GiB for only 5 min
		{"WalrelayRetainedWALHigh", `walrelay_slot_retained_wal_bytes{job="w"} 1e9x30`, 30, false},
		{"WalrelayNotStreaming", "walrelay_state{state=\"streaming\",pod=\"a\"} 1x5 0x20\nwalrelay_state{state=\"streaming\",pod=\"b\"} 0x25", 25, true},
		{"WalrelayNotStreaming", "walrelay_state{state=\"streaming\",pod=\"a\"} 1x25\nwalrelay_state{state=\"streaming\",pod=\"b\"} 0x25", 25, false}, // one streams, one waits
		{"WalrelayNotStreaming", `walrelay_state{state="waiting_for_slot",pod="a"} 1x25`, 25, true},                                                   // no streaming series at all
		{"WalrelayNotStreaming", `walrelay_state{state="polling",pod="a"} 1x25`, 25, false},                                                           // source poll
		{"WalrelayPollBacklogOld", `walrelay_poll_oldest_due_seconds{table="public.outbox"} 0+60x20`, 20, true},
		{"WalrelayPollBacklogOld", `walrelay_poll_oldest_due_seconds{table="public.outbox"} 0+60x8 0x12`, 20, false},
		{"WalrelayPollBacklogOld", `walrelay_poll_oldest_due_seconds{table="public.outbox"} 30x20`, 20, false},
		{"WalrelayDeadLetters", `walrelay_events_dead_lettered_total{table="public.outbox",reason="too_large"} 0x10 1x10`, 15, true},
		{"WalrelayDeadLetters", `walrelay_events_dead_lettered_total{table="public.outbox",reason="too_large"} 5x20`, 15, false},
		{"WalrelayOrderBreak", `walrelay_order_breaks_total{job="w"} 0x5 1x5`, 10, true},
		{"WalrelayOrderBreak", `walrelay_order_breaks_total{job="w"} 0x10`, 10, false},
		{"WalrelayBehindSource", `walrelay_seconds_behind_source{job="w"} 120x20`, 20, true},
		{"WalrelayBehindSource", `walrelay_seconds_behind_source{job="w"} 120x3 0x17`, 20, false},
	}
	tested := map[string]bool{}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%d_%s", i, c.alert), func(t *testing.T) {
			r, ok := byName[c.alert]
			if !ok {
				t.Fatalf("no rule %s", c.alert)
			}
			tested[c.alert] = true
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			storage := promqltest.LoadedStorage(t, "load 1m\n  "+c.series)
			engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
			query := rules.EngineQueryFunc(engine, storage)
			rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), 0, labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", true, log)
			start := time.Unix(0, 0).UTC()
			for m := 0; m <= c.minutes; m++ {
				if _, err := rule.Eval(context.Background(), 0, start.Add(time.Duration(m)*time.Minute), query, nil, 0); err != nil {
					t.Fatalf("minute %d: %v", m, err)
				}
			}
			firing := false
			for _, a := range rule.ActiveAlerts() {
				firing = firing || a.State == rules.StateFiring
			}
			if firing != c.fires {
				t.Fatalf("%s over %q at %d min: firing %v, want %v", c.alert, c.series, c.minutes, firing, c.fires)
			}
		})
	}
	for name := range byName {
		if !tested[name] {
			t.Errorf("rule %s has no case", name)
		}
	}
}
