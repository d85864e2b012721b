package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/outbox"
)

// largeEventBytes is the size of the events that TestLargeEventsBoundedMemory
// sends: larger than the 128 MiB memory limit of
// deploy/kubernetes/walrelay.yaml.
const largeEventBytes = 150_000_000

// manifestMemoryLimit is the memory limit of deploy/kubernetes/walrelay.yaml.
const manifestMemoryLimit = 128 << 20

// TestLargeEventsBoundedMemory sends a logical message of 150 MB
// (pg_logical_emit_message, which any role may call unless the message
// source is on) and an outbox row whose jsonb payload is 150 MB: walrelay
// stays under the Kubernetes manifest's memory limit, dead-letters the row
// (too_large) with its size, its position and what identifies it, and
// publishes the event after them. With outbox.messages on, the message is
// dead-lettered the same way; with it off (the default), it is ignored, as a
// message of any size is: nothing of it reaches Kafka.
func TestLargeEventsBoundedMemory(t *testing.T) {
	long(t)
	t.Parallel()
	for _, messages := range []bool{true, false} {
		t.Run("messages="+strconv.FormatBool(messages), func(t *testing.T) {
			t.Parallel()
			largeEventsBoundedMemory(t, messages)
		})
	}
}

func largeEventsBoundedMemory(t *testing.T, messages bool) {
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc).with("WALRELAY_OUTBOX_MESSAGES", strconv.FormatBool(messages))
	if code, out := runCmd(t, e, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	p := streaming(t, e)
	msgID, rowID, after := outbox.NewID(), outbox.NewID(), outbox.NewID()
	pad := strconv.Itoa(largeEventBytes)
	execSQL(t, conn,
		`SELECT pg_logical_emit_message(true, 'walrelay', '{"id":"`+msgID+`","aggregatetype":"big","aggregateid":"m-1","type":"Big","payload":{"pad":"' || repeat('x', `+pad+`) || '"}}')`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+rowID+`', 'big', 'r-1', 'Big', jsonb_build_object('pad', repeat('y', `+pad+`)))`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+after+`', 'small', 's-1', 'Small', '{}')`,
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := col.Wait(ctx, func([]*kgo.Record) bool {
		return (!messages || recordOf(col, msgID) != nil) && recordOf(col, rowID) != nil && recordOf(col, after) != nil
	}); err != nil {
		t.Fatalf("the large events and the one after them did not all arrive: %v", err)
	}
	rss := p.peakRSS()
	t.Logf("a %d-byte logical message and a %d-byte jsonb payload: walrelay peak RSS %.1f MiB", largeEventBytes, largeEventBytes, float64(rss)/(1<<20))
	limit := rssLimit()
	if rss > limit {
		t.Fatalf("peak RSS %.1f MiB, over the manifest's limit of %d MiB", float64(rss)/(1<<20), limit>>20)
	}
	dead := []struct{ id, key, source string }{{rowID, "r-1", "public.outbox"}}
	if messages {
		dead = append(dead, struct{ id, key, source string }{msgID, "m-1", "message"})
	} else if r := recordOf(col, msgID); r != nil {
		t.Fatalf("with outbox.messages off, the message reached %s: headers %s", r.Topic, headerText(r))
	}
	for _, c := range dead {
		r := recordOf(col, c.id)
		if r.Topic != kc.dlq() {
			t.Fatalf("event %s on %s, want the dead-letter topic", c.id, r.Topic)
		}
		h := func(k string) string { return string(kafkatest.Header(r, k)) }
		omitted, _ := strconv.Atoi(h("walrelay.payload_omitted_bytes"))
		if h("walrelay.reason") != "too_large" || omitted < largeEventBytes || string(r.Key) != c.key || h("walrelay.table") != c.source ||
			h("walrelay.wal_start") == "" || h("walrelay.wal_start") == "0/0" || len(r.Value) != 0 || !strings.Contains(h("walrelay.error"), "postgres.max_message_bytes") {
			t.Fatalf("dead letter of %s: key %q, %d value bytes, headers %s", c.id, r.Key, len(r.Value), headerText(r))
		}
	}
	if r := recordOf(col, after); r.Topic != kc.topic("small") {
		t.Fatalf("the event after them went to %s", r.Topic)
	}
}

// rssLimit is the peak RSS a walrelay under test may reach: the manifest's
// memory limit, times 4 under the race detector (its shadow memory).
func rssLimit() int64 {
	if raceEnabled {
		return 4 * manifestMemoryLimit
	}
	return manifestMemoryLimit
}

// headerText shows a record's headers, for a failure.
func headerText(r *kgo.Record) string {
	var b strings.Builder
	for _, h := range r.Headers {
		b.WriteString(h.Key + "=" + tail(string(h.Value), 200) + " ")
	}
	return b.String()
}

// TestPollLargeRowBoundedMemory: the poll source claims an outbox row whose
// jsonb payload is 150 MB without reading the payload: the row is
// dead-lettered (too_large) with its size and ends DEAD, the row after it is
// published, and walrelay stays under the Kubernetes manifest's memory
// limit.
func TestPollLargeRowBoundedMemory(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	big, after := outbox.NewID(), outbox.NewID()
	execSQL(t, conn,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+big+`', 'big', 'r-1', 'Big', jsonb_build_object('pad', repeat('y', `+strconv.Itoa(largeEventBytes)+`)))`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+after+`', 'small', 's-1', 'Small', '{}')`,
	)
	p := polling(t, pollEnv(pg, kc))
	waitAllSentBut(t, conn, 1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := col.Wait(ctx, func([]*kgo.Record) bool { return recordOf(col, big) != nil && recordOf(col, after) != nil }); err != nil {
		t.Fatalf("the two rows did not both arrive: %v", err)
	}
	rss := p.peakRSS()
	t.Logf("a row with a %d-byte jsonb payload: walrelay peak RSS %.1f MiB", largeEventBytes, float64(rss)/(1<<20))
	limit := rssLimit()
	if rss > limit {
		t.Fatalf("peak RSS %.1f MiB, over the manifest's limit of %d MiB", float64(rss)/(1<<20), limit>>20)
	}
	r := recordOf(col, big)
	h := func(k string) string { return string(kafkatest.Header(r, k)) }
	if omitted, _ := strconv.Atoi(h("walrelay.payload_omitted_bytes")); r.Topic != kc.dlq() || h("walrelay.reason") != "too_large" || omitted < largeEventBytes || len(r.Value) != 0 || string(r.Key) != "r-1" {
		t.Fatalf("the large row: on %s, key %q, %d value bytes, headers %s", r.Topic, r.Key, len(r.Value), headerText(r))
	}
	if r := recordOf(col, after); r == nil || r.Topic != kc.topic("small") {
		t.Fatalf("the row after it: %v", r)
	}
}

// TestReplayLargeRowBoundedMemory: `walrelay replay` over a window that
// holds a row with a 150 MB jsonb payload reads the row without its payload
// and dead-letters it (too_large) with its size; the other row is sent
// again, and the command stays under the Kubernetes manifest's memory limit
// (it may run in walrelay's pod).
func TestReplayLargeRowBoundedMemory(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	big, small := outbox.NewID(), outbox.NewID()
	execSQL(t, conn,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+big+`', 'big', 'r-1', 'Big', jsonb_build_object('pad', repeat('y', `+strconv.Itoa(largeEventBytes)+`)))`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+small+`', 'small', 's-1', 'Small', '{}')`,
	)
	p := start(t, baseEnv(pg, kc), "replay", "--all", "--yes")
	// VmHWM read while the command runs, not the rusage of its exit: that
	// counts the test process's own peak too (the child shares its memory
	// until exec), hundreds of MiB in the whole suite.
	peak := make(chan int64)
	go func() {
		var high int64
		for {
			high = max(high, p.peakRSS())
			select {
			case <-p.done:
				peak <- high
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	if code := p.exit(2 * time.Minute); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, p.out.String())
	}
	rss := <-peak
	t.Logf("replay of a row with a %d-byte jsonb payload: peak RSS %.1f MiB", largeEventBytes, float64(rss)/(1<<20))
	limit := rssLimit()
	if rss > limit {
		t.Fatalf("peak RSS %.1f MiB, over the manifest's limit of %d MiB", float64(rss)/(1<<20), limit>>20)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := col.Wait(ctx, func([]*kgo.Record) bool { return recordOf(col, big) != nil && recordOf(col, small) != nil }); err != nil {
		t.Fatalf("the two rows did not both arrive: %v", err)
	}
	r := recordOf(col, big)
	h := func(k string) string { return string(kafkatest.Header(r, k)) }
	if omitted, _ := strconv.Atoi(h("walrelay.payload_omitted_bytes")); r.Topic != kc.dlq() || h("walrelay.reason") != "too_large" || omitted < largeEventBytes || len(r.Value) != 0 {
		t.Fatalf("the large row: on %s, %d value bytes, headers %s", r.Topic, len(r.Value), headerText(r))
	}
}

// TestForeignPrefixesBoundedMemory: a role without any privilege emits 60
// messages, each under its own prefix of 2.5 MB (under
// postgres.max_message_bytes, so each is read whole). walrelay ignores
// them and keeps only a short form of the prefixes it logs: it stays under
// the manifest's limit, and the next row is published.
func TestForeignPrefixesBoundedMemory(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setup(t)
	su := connect(t, pg.DSN)
	mallory := asRole(t, pg, su, "mallory")
	p := streaming(t, baseEnv(pg, kc))
	execSQL(t, mallory, "SELECT count(pg_logical_emit_message(true, repeat('x', 2500000) || i, 'y')) FROM generate_series(1, 60) i")
	id := outbox.NewID()
	execSQL(t, su, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('"+id+"', 'payments', 'acct-1', 'Captured', '{}')")
	waitAll(t, col, []string{id}, time.Minute)
	peak := p.peakRSS()
	t.Logf("peak RSS %d MiB", peak>>20)
	p.running()
	limit := rssLimit()
	if peak > limit {
		t.Fatalf("peak RSS %d MiB after 60 ignored messages from a role without privileges, over the manifest's %d MiB", peak>>20, limit>>20)
	}
}

// TestPollLargeHeaderColumnBoundedMemory: the poll source measures every
// column it reads, not only the payload: a row with a 150 MB header column
// (outbox.header_columns) is claimed without its columns and dead-lettered
// too_large, the row after it is published, and walrelay stays under the
// manifest's limit.
func TestPollLargeHeaderColumnBoundedMemory(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	big, after := outbox.NewID(), outbox.NewID()
	execSQL(t, conn, "ALTER TABLE outbox ADD COLUMN tenant text",
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant) VALUES ('`+big+`', 'big', 'b-1', 'Big', '{}', repeat('k', `+strconv.Itoa(largeEventBytes)+`))`,
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+after+`', 'small', 's-1', 'Small', '{}')`,
	)
	p := polling(t, pollEnv(pg, kc).with("WALRELAY_OUTBOX_HEADER_COLUMNS", "tenant"))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := col.Wait(ctx, func([]*kgo.Record) bool { return recordOf(col, big) != nil && recordOf(col, after) != nil }); err != nil {
		t.Fatalf("the two rows did not both arrive: %v\n%s", err, tail(p.out.String(), 2000))
	}
	rss := p.peakRSS()
	t.Logf("a row with a %d-byte header column: peak RSS %d MiB", largeEventBytes, rss>>20)
	limit := rssLimit()
	if rss > limit {
		t.Fatalf("peak RSS %d MiB, over the manifest's %d MiB", rss>>20, limit>>20)
	}
	r := recordOf(col, big)
	h := func(k string) string { return string(kafkatest.Header(r, k)) }
	if omitted, _ := strconv.Atoi(h("walrelay.payload_omitted_bytes")); r.Topic != kc.dlq() || h("walrelay.reason") != "too_large" || omitted < largeEventBytes || len(h("tenant")) > 0 {
		t.Fatalf("the large row: on %s, headers %s", r.Topic, headerText(r))
	}
}
