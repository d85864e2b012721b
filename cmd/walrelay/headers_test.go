package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// TestKafkaHeadersNone: with kafka.headers empty, walrelay's records carry
// the id header alone, as Debezium's EventRouter writes them, and replay's
// add only walrelay.replay; reconcile, which matches records by id, still
// finds every row on its topic.
func TestKafkaHeadersNone(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_HEADERS", "")
	p := streaming(t, e)
	insertBoth(t, pg.DSN, "h", 3)
	waitfor.Until(t, time.Minute, "6 published", func() bool { c, _ := onTopics(col, kc); return len(c) == 6 })
	for _, r := range col.Records() {
		var keys []string
		for _, h := range r.Headers {
			keys = append(keys, h.Key)
		}
		if strings.Join(keys, " ") != "id" {
			t.Fatalf("a record with the headers %v, want id alone", keys)
		}
	}
	if code, out := runCmd(t, e, "reconcile", "--all"); code != 0 || !strings.Contains(out, "6 on their topic") {
		t.Fatalf("reconcile --all: exit %d:\n%s", code, out)
	}
	if code, out := runCmd(t, e, "replay", "--all", "--yes"); code != 0 {
		t.Fatalf("replay --all --yes: exit %d:\n%s", code, out)
	}
	waitfor.Until(t, time.Minute, "6 replayed", func() bool { _, r := onTopics(col, kc); return len(r) == 6 })
	_, replayed := onTopics(col, kc)
	for _, r := range replayed {
		var keys []string
		for _, h := range r.Headers {
			keys = append(keys, h.Key)
		}
		if strings.Join(keys, " ") != "id walrelay.replay" {
			t.Fatalf("a replayed record with the headers %v, want id and walrelay.replay", keys)
		}
	}
	p.signal(syscall.SIGTERM)
	p.exit(time.Minute)
}
