package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/sink"
)

// TestCheckWarnsOfUnverifiedPostgres: walrelay check prints a WARN line for
// a PostgreSQL host reached without sslmode=verify-full (the default,
// require), naming the host and the fix, and none for a unix socket or a
// loopback address; the DSN's password is never printed. The connections
// fail (nothing listens): the line comes before them.
func TestCheckWarnsOfUnverifiedPostgres(t *testing.T) {
	t.Parallel()
	const password = "Pw-0f-the-DSN"
	for _, c := range []struct {
		dsn  string
		warn bool
	}{
		{"host=192.0.2.1 port=5432 user=app password=" + password + " dbname=shop connect_timeout=1 sslmode=require", true},
		{"postgres://app:" + password + "@192.0.2.1:5432/shop?connect_timeout=1", true}, // sslmode prefer: may be plaintext
		{"host=127.0.0.1 port=1 user=app password=" + password + " dbname=shop connect_timeout=1", false},
		{"host=/nonexistent-walrelay-socket-dir user=app password=" + password + " dbname=shop connect_timeout=1", false},
	} {
		var stdout, stderr bytes.Buffer
		_ = cmdCheck(t.Context(), []string{"--postgres.dsn", c.dsn}, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		warned := strings.Contains(out, "WARN  postgres tls") && strings.Contains(out, "sslmode=verify-full") && strings.Contains(out, "192.0.2.1")
		if warned != c.warn || strings.Contains(out, password) {
			t.Fatalf("check with %s: warned %v, want %v (and no password):\n%s", strings.ReplaceAll(c.dsn, password, "…"), warned, c.warn, out)
		}
	}
}

// TestRunWarnsOfUnverifiedPostgres: walrelay run, of either source, logs a
// warning at start for a PostgreSQL host reached without verify-full, and
// none for a loopback one; the password is not printed. The database is
// unreachable; the run is stopped after its start.
func TestRunWarnsOfUnverifiedPostgres(t *testing.T) {
	t.Parallel()
	const password = "Pw-0f-the-DSN"
	for _, c := range []struct {
		source, dsn string
		warn        bool
	}{
		{"wal", "host=192.0.2.1 user=app password=" + password + " dbname=shop connect_timeout=1 sslmode=require", true},
		{"poll", "host=192.0.2.1 user=app password=" + password + " dbname=shop connect_timeout=1", true},
		{"wal", "host=127.0.0.1 port=1 user=app password=" + password + " dbname=shop connect_timeout=1", false},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		var stderr bytes.Buffer
		_ = cmdRun(ctx, []string{"--source", c.source, "--postgres.dsn", c.dsn, "--kafka.brokers", "127.0.0.1:1", "--admin.listen", ""}, &stderr)
		cancel()
		out := stderr.String()
		warned := strings.Contains(out, "level=WARN") && strings.Contains(out, "postgres tls: 192.0.2.1")
		if warned != c.warn || strings.Contains(out, password) {
			t.Fatalf("run, source %s: warned %v, want %v (and no password):\n%s", c.source, warned, c.warn, out)
		}
	}
}

// TestRowCannotChooseWalrelaysTopics: with a template that is the aggregate
// type alone, rows whose aggregate type names the dead-letter topic, the
// offsets topic or a topic outside kafka.allowed_topics are dead-lettered
// (forbidden_topic) and nothing else reaches those topics; an allowed
// topic gets its event. check reports the routing confined.
func TestRowCannotChooseWalrelaysTopics(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	offsets, other := kc.prefix+"walrelay.offsets", kc.prefix+"app.commands"
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_TOPIC", "{aggregatetype}", "WALRELAY_KAFKA_OFFSETS_TOPIC", offsets,
		"WALRELAY_KAFKA_ALLOWED_TOPICS", kc.prefix+"outbox.event.*")
	if code, out := runCmd(t, e, "check"); code != 0 || !strings.Contains(out, "OK    topic routing") {
		t.Fatalf("check: exit %d\n%s", code, out)
	}
	stray, err := kafkatest.Collect(kc.Addrs(), regexp.QuoteMeta(offsets)+"|"+regexp.QuoteMeta(other))
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	p := streaming(t, e)
	conn := connect(t, pg.DSN)
	for i, agg := range []string{kc.dlq(), offsets, other, kc.topic("order")} {
		if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'a', 'T', '{}')",
			fmt.Sprintf("00000000-0000-7000-8000-%012d", i), agg); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := col.Wait(t.Context(), func(r []*kgo.Record) bool { return len(r) >= 4 })
	if err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	time.Sleep(300 * time.Millisecond) // a record that should not come would be here now
	forbidden := 0
	for _, r := range col.Records() {
		switch {
		case r.Topic == kc.dlq() && string(kafkatest.Header(r, sink.HeaderReason)) == sink.ReasonForbiddenTopic:
			forbidden++
		case r.Topic == kc.topic("order"):
		default:
			t.Fatalf("a record on %s, reason %q", r.Topic, kafkatest.Header(r, sink.HeaderReason))
		}
	}
	if forbidden != 3 || len(recs) != 4 || len(stray.Records()) != 0 {
		t.Fatalf("%d dead-lettered as forbidden of %d records, %d on the offsets or another topic: want 3 of 4, and none", forbidden, len(recs), len(stray.Records()))
	}
	p.signal(syscall.SIGTERM)
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.out.String())
	}
}
