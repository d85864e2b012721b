package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	wevent "github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

// versioned is an event of aggregate key at version v (its value's seq is
// v too, for the effects), as walrelay writes it with
// outbox.version_column.
func versioned(key string, v int) *kgo.Record {
	r := event(outbox.NewID(), key, v)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: wevent.HeaderAggregateVersion, Value: []byte(strconv.Itoa(v))})
	return r
}

// keptVersion is the version the inbox keeps for key, -1 for none.
func (e *env) keptVersion(t *testing.T, key string) int64 {
	t.Helper()
	v := int64(-1)
	err := e.pool.QueryRow(t.Context(), "SELECT version FROM walrelay_inbox_versions WHERE consumer = 'shipping' AND topic = $1 AND aggregate = $2", topic, []byte(key)).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return v
}

// TestVersionOrderSkipsStale: with VersionOrder, an aggregate's first
// event is handled whatever its version (5 here), then each next one; an
// event of a version at or below the last handled (a new id: not a
// duplicate) is skipped and counted, and its id kept, so it is skipped
// as a duplicate when delivered again; an event without the version header
// is handled and counted; one whose header is not a number is
// dead-lettered as invalid_version.
func TestVersionOrderSkipsStale(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	staleAgain := versioned("a", 5)
	bad := versioned("b", 1)
	bad.Headers[len(bad.Headers)-1].Value = []byte("one")
	e.produce(t, versioned("a", 5), versioned("a", 6), staleAgain, versioned("a", 6), event(outbox.NewID(), "c", 1), bad, versioned("a", 7), staleAgain)
	reg := prometheus.NewRegistry()
	stop := e.start(t, inbox.Config{VersionOrder: true, Registerer: reg}, record)
	stale, missing, dups := mustVec(t, reg, "walrelay_inbox_version_stale_total"), mustVec(t, reg, "walrelay_inbox_version_missing_total"), mustVec(t, reg, "walrelay_inbox_duplicates_total")
	waitfor.Until(t, time.Minute, "4 handled, 2 stale, 1 duplicate, 1 dead letter", func() bool {
		return e.count(t) == 4 && testutil.ToFloat64(stale) == 2 && testutil.ToFloat64(dups) == 1 && len(dlq.Records()) == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	_, perKey := e.effects(t)
	if got := perKey["a"]; fmt.Sprint(got) != "[5 6 7]" {
		t.Fatalf("aggregate a handled versions %v, want [5 6 7]", got)
	}
	if len(perKey["c"]) != 1 || testutil.ToFloat64(missing) != 1 {
		t.Fatalf("the event without a version: handled %v, counted %v", perKey["c"], testutil.ToFloat64(missing))
	}
	if v := e.keptVersion(t, "a"); v != 7 {
		t.Fatalf("kept version of a %d, want 7", v)
	}
	d := dlq.Records()[0]
	if r := string(kafkatest.Header(d, sink.HeaderReason)); r != "invalid_version" || !strings.Contains(string(kafkatest.Header(d, sink.HeaderError)), `"one" is not a decimal integer`) {
		t.Fatalf("dead letter of the bad version: %s: %s", r, kafkatest.Header(d, sink.HeaderError))
	}
}

// TestVersionGapWaitsThenDeadLetters: an event whose version is ahead of
// its aggregate's next waits VersionWait, while other aggregates' events
// of its partition are handled, then is dead-lettered with reason
// version_gap and an error naming the aggregate, the version expected and
// the one got; the aggregate's kept version does not move.
func TestVersionGapWaitsThenDeadLetters(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	const wait = 2 * time.Second
	stop := e.start(t, inbox.Config{VersionOrder: true, VersionWait: wait}, record)
	e.produce(t, versioned("a", 1))
	waitfor.Until(t, time.Minute, "a@1 handled", func() bool { return e.count(t) == 1 })
	sent := time.Now()
	e.produce(t, versioned("a", 3), versioned("b", 1), versioned("b", 2))
	waitfor.Until(t, time.Minute, "b handled", func() bool { return e.count(t) == 3 })
	if n := len(dlq.Records()); n != 0 || time.Since(sent) >= wait {
		t.Fatalf("%d dead letters %s after the gap (the wait is %s)", n, time.Since(sent), wait)
	}
	waitfor.Until(t, time.Minute, "the gap dead-lettered", func() bool { return len(dlq.Records()) == 1 })
	if waited := time.Since(sent); waited < wait {
		t.Fatalf("dead-lettered after %s, before VersionWait %s", waited, wait)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	d := dlq.Records()[0]
	reason, msg := string(kafkatest.Header(d, sink.HeaderReason)), string(kafkatest.Header(d, sink.HeaderError))
	if reason != "version_gap" || !strings.Contains(msg, `aggregate "a" of topic `+topic+`: expected version 2, got 3`) {
		t.Fatalf("dead letter %s: %s", reason, msg)
	}
	if v := e.keptVersion(t, "a"); v != 1 {
		t.Fatalf("kept version of a %d, want 1", v)
	}
}

// TestVersionLateArrivalReleases: versions 3 and 4 of an aggregate wait
// for 2, which comes after them in the partition (a dead letter replayed,
// say); once 2 is handled, 3 and 4 are, in order, and none is
// dead-lettered.
func TestVersionLateArrivalReleases(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.collectDLQ(t)
	stop := e.start(t, inbox.Config{VersionOrder: true}, record)
	e.produce(t, versioned("a", 1), versioned("a", 3), versioned("a", 4), versioned("b", 1))
	waitfor.Until(t, time.Minute, "a@1 and b@1 handled", func() bool { return e.count(t) == 2 })
	time.Sleep(300 * time.Millisecond) // room for 3 or 4 to be handled wrongly
	if n := e.count(t); n != 2 {
		t.Fatalf("%d handled before version 2 came, want 2", n)
	}
	e.produce(t, versioned("a", 2))
	waitfor.Until(t, time.Minute, "a@2, 3 and 4 handled", func() bool { return e.count(t) == 5 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, perKey := e.effects(t); fmt.Sprint(perKey["a"]) != "[1 2 3 4]" {
		t.Fatalf("aggregate a handled in the order %v, want [1 2 3 4]", perKey["a"])
	}
	if n := len(dlq.Records()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// TestVersionKeptWithTheHandler: the kept version moves only with the
// handler's transaction. A handler that fails once on version 2 leaves
// version 1 kept, so its retry is handled, not skipped as stale; a
// consumer stopped while version 4 waits for 3 does not commit its
// offset past 4, and the next consumer of the group reads 4 again,
// handles 3 when it comes, then 4: every event once, in order.
func TestVersionKeptWithTheHandler(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	var mu sync.Mutex
	failed := false
	failOnce := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := record(ctx, tx, m); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if string(m.Headers[wevent.HeaderAggregateVersion]) == "2" && !failed {
			failed = true
			return errors.New("the handler fails once, after its write")
		}
		return nil
	}
	cfg := inbox.Config{VersionOrder: true, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 20 * time.Millisecond}
	stop := e.start(t, cfg, failOnce)
	e.produce(t, versioned("a", 1), versioned("a", 2), versioned("a", 4))
	waitfor.Until(t, time.Minute, "a@1 and a@2 handled", func() bool { return e.count(t) == 2 })
	time.Sleep(1500 * time.Millisecond) // an offset commit (every second) while 4 waits
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if v := e.keptVersion(t, "a"); v != 2 {
		t.Fatalf("kept version %d after the first consumer, want 2", v)
	}
	e.produce(t, versioned("a", 3))
	stop = e.start(t, cfg, failOnce)
	waitfor.Until(t, time.Minute, "a@3 and a@4 handled", func() bool { return e.count(t) == 4 })
	time.Sleep(300 * time.Millisecond) // room for an effect twice
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	perID, perKey := e.effects(t)
	if fmt.Sprint(perKey["a"]) != "[1 2 3 4]" || len(perID) != 4 {
		t.Fatalf("aggregate a handled %v (%d events), want [1 2 3 4], each once", perKey["a"], len(perID))
	}
	if v := e.keptVersion(t, "a"); v != 4 {
		t.Fatalf("kept version %d, want 4", v)
	}
}
