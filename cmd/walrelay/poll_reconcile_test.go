package main

import (
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestPollReconcileReplayKeepsAggregateOrder (issue 36, review of item 6):
// with source poll, reconcile judges only the rows the poller considers
// sent (SENT, DEAD): the unsent ones (PENDING in backoff, PARKED behind
// it) are in flight, not judged, and --replay never sends them ahead of
// their aggregate's first unsent row. A SENT row missing from its topic
// is set back to PENDING for the poller, which sends it in its turn.
func TestPollReconcileReplayKeepsAggregateOrder(t *testing.T) {
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	ids := []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003",
		"00000000-0000-4000-8000-000000000004", "00000000-0000-4000-8000-000000000005"}
	sets := []string{
		// order-1: its first row in backoff, two parked behind it.
		"available_at = now() + interval '1 hour', attempts = 1, created_at = now() - interval '2 hours'",
		"status = 'PARKED'", "status = 'PARKED'",
		// order-2: a row marked SENT that its topic lacks, and an unsent one after it.
		"status = 'SENT', sent_at = now(), attempts = 1, created_at = now() - interval '10 minutes'",
		"available_at = now() + interval '1 hour'",
	}
	for i, st := range sets {
		agg := "order-1"
		if i >= 3 {
			agg = "order-2"
		}
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'T', '{}')`, ids[i], agg); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "UPDATE outbox SET "+st+" WHERE id = $1", ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	code, out := runCmd(t, pollEnv(pg, kc), "reconcile", "--since", "1h", "--replay", "--yes")
	t.Logf("reconcile --since 1h --replay --yes: exit %d\n%s", code, tail(out, 1500))
	time.Sleep(2 * time.Second)
	var got []string
	for _, r := range col.Records() {
		if r.Topic == kc.topic("order") {
			got = append(got, string(kafkatest.Header(r, "id")))
		}
	}
	if len(got) > 0 {
		t.Fatalf("reconcile --replay --yes on a poll outbox published %v itself: rows the poller had not sent (PARKED behind their aggregate's first row, or after a row it must send again) go out of order", got)
	}
	if code != 0 {
		t.Fatalf("reconcile --replay --yes: exit %d, want 0\n%s", code, out)
	}
	for _, want := range []string{"3 rows of the window in flight (PENDING, SENDING or PARKED): not judged", "1 missing", "set 1 SENT rows missing from their topic back to PENDING"} {
		if !strings.Contains(out, want) {
			t.Errorf("reconcile's output lacks %q", want)
		}
	}
	st := map[string]string{}
	for _, id := range ids {
		var s string
		if err := conn.QueryRow(ctx, "SELECT status FROM outbox WHERE id = $1", id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		st[id[len(id)-1:]] = s
	}
	if st["4"] != "PENDING" || st["1"] != "PENDING" || st["2"] != "PARKED" || st["3"] != "PARKED" || st["5"] != "PENDING" {
		t.Fatalf("statuses after reconcile --replay: %v; want the SENT row missing from its topic (4) PENDING, the rest unchanged", st)
	}
	// The poller sends order-2's rows in order, 4 then 5, once 5 is due.
	if _, err := conn.Exec(ctx, "UPDATE outbox SET available_at = now() WHERE id = $1", ids[4]); err != nil {
		t.Fatal(err)
	}
	p := polling(t, pollEnv(pg, kc))
	defer p.kill()
	var order2 []string
	deadline := time.Now().Add(30 * time.Second)
	for len(order2) < 2 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		order2 = order2[:0]
		for _, r := range col.Records() {
			if r.Topic == kc.topic("order") && string(r.Key) == "order-2" {
				order2 = append(order2, string(kafkatest.Header(r, "id")))
			}
		}
	}
	if len(order2) != 2 || !strings.HasSuffix(order2[0], "4") || !strings.HasSuffix(order2[1], "5") {
		t.Fatalf("order-2 on its topic after the poller ran: %v, want 4 then 5", order2)
	}
}

// TestPollReplayLeavesUnsentRows (issue 36, review of item 6): replay
// --since on a poll outbox sends only rows the poller sent (SENT, DEAD):
// a PARKED row, behind its aggregate's first row in backoff, is left to
// the poller, which sends it in order.
func TestPollReplayLeavesUnsentRows(t *testing.T) {
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	for i, st := range []string{"status = 'SENT', sent_at = now(), attempts = 1", "available_at = now() + interval '1 hour', attempts = 1", "status = 'PARKED'"} {
		id := []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-000000000003"}[i]
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'order-1', 'T', '{}')`, id); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "UPDATE outbox SET "+st+" WHERE id = $1", id); err != nil {
			t.Fatal(err)
		}
	}
	code, out := runCmd(t, pollEnv(pg, kc), "replay", "--since", "1h", "--yes")
	t.Logf("replay --since 1h --yes: exit %d\n%s", code, tail(out, 1500))
	time.Sleep(2 * time.Second)
	var got []string
	for _, r := range col.Records() {
		if r.Topic == kc.topic("order") {
			got = append(got, string(kafkatest.Header(r, "id")))
		}
	}
	if len(got) != 1 || !strings.HasSuffix(got[0], "1") {
		t.Fatalf("replay --since 1h --yes on a poll outbox published %v, want only the SENT row 1 (2 is in backoff, 3 PARKED behind it: the poller's to send, in order)", got)
	}
	if code != 0 || !strings.Contains(out, "2 rows of the window not sent yet by the poller (PENDING, SENDING or PARKED): left to it") {
		t.Fatalf("replay: exit %d, output lacks the unsent rows left to the poller", code)
	}
}
