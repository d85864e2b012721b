package sink

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink/record"
)

// TestOmitHeaders: with every optional header left out, a record carries
// id and its header columns only, as Debezium's EventRouter writes it; with
// CloudEvents, ce_time is still the commit time without
// walrelay.commit_time; the id header cannot be left out, nor a header
// walrelay does not write. Before, type and the walrelay.* headers were
// always sent.
func TestOmitHeaders(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	col, err := kafkatest.Collect(kc.Addrs(), `plain|ce`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	all := record.OptionalHeaders[:]
	if err := publish(t, newSink(t, kc, Config{Topic: "plain", OmitHeaders: all}), newEvent("e1")); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, newSink(t, kc, Config{Topic: "ce", OmitHeaders: all, CloudEvents: "binary", CloudEventsSource: "/db/{table}"}), newEvent("e2")); err != nil {
		t.Fatal(err)
	}
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		var keys []string
		for _, h := range r.Headers {
			keys = append(keys, h.Key)
		}
		want := "id tenant"
		if r.Topic == "ce" {
			want = "id tenant ce_specversion ce_id ce_source ce_type ce_subject content-type ce_time"
			if got := string(kafkatest.Header(r, "ce_time")); got != "2026-01-02T03:04:05.000006Z" {
				t.Errorf("ce_time %q, want the commit time", got)
			}
		}
		if got := strings.Join(keys, " "); got != want {
			t.Errorf("topic %s: headers %s, want %s", r.Topic, got, want)
		}
	}
	for _, c := range []struct{ omit, want string }{
		{"id", "the id header is always sent"},
		{"walrelay.replay", `"walrelay.replay" is not a header that can be left out`},
	} {
		if _, err := New(Config{Brokers: kc.Addrs(), OmitHeaders: []string{c.omit}}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OmitHeaders %s: %v, want %q", c.omit, err, c.want)
		}
	}
}

// TestNoTimeNoCommitTimeHeader: an event of no known time (a replayed row
// without a time column, a poll row that was in the table before migrate
// added created_at) carries no walrelay.commit_time header, where it
// carried 0001-01-01T00:00:00Z; its other headers stay, an empty type
// included.
func TestNoTimeNoCommitTimeHeader(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	col, err := kafkatest.Collect(kc.Addrs(), `notime`)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	e := newEvent("e1")
	e.CommitTime, e.Type = time.Time{}, ""
	if err := publish(t, newSink(t, kc, Config{Topic: "notime"}), e); err != nil {
		t.Fatal(err)
	}
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, h := range recs[0].Headers {
		keys = append(keys, h.Key)
	}
	if got, want := strings.Join(keys, " "), "id type walrelay.lsn walrelay.xid tenant"; got != want {
		t.Fatalf("headers of an event of no time: %s, want %s", got, want)
	}
}
