package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/sink"
)

// TestVersionHeader: with outbox.version_column, each record carries the
// row's version as the walrelay.aggregate_version header, from the WAL
// source in both delivery modes and from the poll source; a row whose
// version is NULL is dead-lettered saying so, never published without
// it. check refuses a version column of a type not an integer, and one the
// table lacks.
func TestVersionHeader(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		migrate []string
		env     func(*pgtest.Server, *broker) env
		ready   func(*testing.T, env) *proc
	}{
		{"wal", []string{"migrate"}, baseEnv, streaming},
		{"wal, exactly once", []string{"migrate"}, eosEnv, streaming},
		{"poll", []string{"migrate", "--poll"}, pollEnv, polling},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			kc := newBroker(t)
			pg := pgtest.Start(t)
			e := c.env(pg, kc).with("WALRELAY_OUTBOX_VERSION_COLUMN", "aggregate_version")
			mustRun(t, e, c.migrate...)
			col := committedCollector(t, kc)
			p := c.ready(t, e)
			conn := connect(t, pg.DSN)
			execSQL(t, conn, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_version) VALUES
				(gen_random_uuid(), 'order', 'o-1', 'Created', '{}', 1),
				(gen_random_uuid(), 'order', 'o-1', 'Paid', '{}', 2),
				(gen_random_uuid(), 'order', 'o-2', 'Created', '{}', 9007199254740993),
				(gen_random_uuid(), 'order', 'o-1', 'Shipped', '{}', NULL)`)
			var published, dead []string
			waitfor.Until(t, time.Minute, "3 published and 1 dead-lettered", func() bool {
				published, dead = nil, nil
				for _, r := range col.Records() {
					if r.Topic == kc.dlq() {
						dead = append(dead, string(kafkatest.Header(r, sink.HeaderReason))+": "+string(kafkatest.Header(r, sink.HeaderError)))
						continue
					}
					published = append(published, string(r.Key)+"@"+string(kafkatest.Header(r, event.HeaderAggregateVersion)))
				}
				return len(published) == 3 && len(dead) == 1
			})
			if got := strings.Join(published, " "); got != "o-1@1 o-1@2 o-2@9007199254740993" {
				t.Fatalf("published %s, want o-1@1 o-1@2 o-2@9007199254740993", got)
			}
			if !strings.HasPrefix(dead[0], "invalid_event: ") || !strings.Contains(dead[0], "aggregate_version is NULL") {
				t.Fatalf("the dead letter of the NULL version: %s", dead[0])
			}
			p.signal(syscall.SIGTERM)
			p.exit(time.Minute)

			execSQL(t, conn, "ALTER TABLE outbox ALTER COLUMN aggregate_version TYPE text")
			if code, out := runCmd(t, e, "check"); code == 0 || !strings.Contains(out, `column "aggregate_version" is text; as the version column it must be one of smallint, integer, bigint`) {
				t.Fatalf("check of a text version column: exit %d:\n%s", code, out)
			}
			if code, out := runCmd(t, e.with("WALRELAY_OUTBOX_VERSION_COLUMN", "version"), "check"); code == 0 || !strings.Contains(out, `has no column "version" (outbox.version_column)`) {
				t.Fatalf("check of a missing version column: exit %d:\n%s", code, out)
			}
		})
	}
}
