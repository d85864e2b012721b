package main

import (
	"math/rand/v2"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
)

// eosEnv is baseEnv in exactly-once mode, with an offsets topic of the
// test's own.
func eosEnv(pg *pgtest.Server, kc *broker) env {
	e := baseEnv(pg, kc)
	e["WALRELAY_KAFKA_EXACTLY_ONCE"] = "true"
	e["WALRELAY_KAFKA_OFFSETS_TOPIC"] = kc.prefix + "walrelay.offsets"
	return e
}

// committedCollector reads the test's topics as a consumer of exactly-once
// mode must: with read_committed isolation.
func committedCollector(t *testing.T, kc *broker) *kafkatest.Collector {
	t.Helper()
	q := regexp.QuoteMeta(kc.prefix)
	col, err := kafkatest.Collect(kc.Addrs(), q+`outbox\.event\..*|`+q+`walrelay\.dlq`, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	return col
}

// TestExactlyOnceSurvivesSIGKILL: three SIGKILLs at random moments while
// rows are written without pause, in exactly-once mode: a read_committed
// consumer sees every committed row once, in order per aggregate.
func TestExactlyOnceSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	pg, kc, _ := setup(t)
	col := committedCollector(t, kc)
	conn := connect(t, pg.DSN)
	w := newWriter(50, 2)
	w.bytes = 200
	stop := w.keepWriting(t.Context(), pg.DSN)
	rng := rand.New(rand.NewPCG(5, 5))
	e := eosEnv(pg, kc)
	for i := range 3 {
		p := streaming(t, e)
		time.Sleep(time.Duration(200+rng.IntN(2300)) * time.Millisecond)
		p.kill()
		t.Logf("kill %d: %d rows written, %d records read so far, slot confirmed at %s", i+1, len(w.written()), len(col.Records()), slotConfirmed(t, conn, "walrelay"))
	}
	streaming(t, e)
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	want := committedIDs(t, conn)
	waitAll(t, col, want, 2*time.Minute)
	// Room for a late duplicate to show.
	time.Sleep(time.Second)
	c := count(col.Records(), want)
	t.Logf("exactly-once after 3 SIGKILLs: rows committed %d, %s", len(want), c)
	if c.duplicates != 0 || c.orderViolations != 0 || c.missing != 0 {
		t.Fatalf("exactly-once broken: %s", c)
	}
}
