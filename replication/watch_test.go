package replication

import (
	"strings"
	"testing"
)

// watchServer gives a test a server with an outbox, a slot and a
// publication made by create, the watch's first reading, exec, the next
// reading's problems, and the count of inserts in the slot's stream.
func watchServer(t *testing.T, create string) (exec func(string), read func() []string, inserts func() int) {
	t.Helper()
	_, conn := serverConn(t)
	ctx := t.Context()
	exec = execer(t, conn)
	exec("CREATE SCHEMA ob; CREATE TABLE ob.outbox (id int PRIMARY KEY); CREATE TABLE ob.other (id int PRIMARY KEY)")
	exec(create)
	exec("SELECT pg_create_logical_replication_slot('w', 'pgoutput')")
	tables := []Table{{Schema: "ob", Name: "outbox"}}
	m, problems, err := WatchPublication(ctx, conn, "p", tables, Membership{})
	if err != nil || len(problems) > 0 {
		t.Fatalf("first reading: %v, %v", problems, err)
	}
	read = func() []string {
		t.Helper()
		now, problems, err := WatchPublication(ctx, conn, "p", tables, m)
		if err != nil {
			t.Fatal(err)
		}
		m = now
		return problems
	}
	inserts = func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('w', NULL, NULL,
			'proto_version', '1', 'publication_names', 'p') WHERE substr(data, 1, 1) = 'I'::bytea`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return exec, read, inserts
}

// passedOver publishes ob.outbox by create, writes row 1, unpublishes it by
// off, writes row 2 (passed over by the stream), publishes it again by on
// and writes row 3: the watch's next reading must see it, and its problems
// are returned. how says what was done between the two readings.
func passedOver(t *testing.T, create, off, on, how string) []string {
	t.Helper()
	exec, read, inserts := watchServer(t, create)
	exec("INSERT INTO ob.outbox VALUES (1)")
	exec(off)
	exec("INSERT INTO ob.outbox VALUES (2)") // passed over
	exec(on)
	exec("INSERT INTO ob.outbox VALUES (3)")
	if n := inserts(); n != 2 {
		t.Fatalf("the stream holds %d of 3 rows; the test expects row 2 passed over", n)
	}
	problems := read()
	if len(problems) == 0 {
		t.Fatalf("WatchPublication saw nothing, but row 2 of ob.outbox was passed over by the stream (%s between two readings)", how)
	}
	return problems
}

// TestWatchPublicationSeesPublishToggledOffAndOn: second review of #37
// (review37b). Inserts turned off and on again between two readings (5 s
// apart in walrelay run) pass the rows written in between over, with no
// error. The watch compared only the publication's oid and its pubinsert
// as read, and saw nothing; it now sees the publication's row rewritten.
func TestWatchPublicationSeesPublishToggledOffAndOn(t *testing.T) {
	t.Parallel()
	problems := passedOver(t, "CREATE PUBLICATION p FOR TABLE ob.outbox WITH (publish = 'insert')",
		"ALTER PUBLICATION p SET (publish = 'update')", "ALTER PUBLICATION p SET (publish = 'insert')",
		"publish turned off and on")
	if !strings.Contains(strings.Join(problems, "; "), "rewritten") {
		t.Fatalf("problems %q do not say the publication's row was rewritten", problems)
	}
}

// TestWatchPublicationSeesSchemaDroppedAndAddedAgain: second review of #37
// (review37b). An outbox published through FOR TABLES IN SCHEMA, the
// schema dropped from the publication and added again between two
// readings: the rows written in between are passed over. The watch asked
// only whether a pg_publication_namespace row covered the table, not
// whether it was the same row, and saw nothing.
func TestWatchPublicationSeesSchemaDroppedAndAddedAgain(t *testing.T) {
	t.Parallel()
	passedOver(t, "CREATE PUBLICATION p FOR TABLES IN SCHEMA ob WITH (publish = 'insert')",
		"ALTER PUBLICATION p DROP TABLES IN SCHEMA ob", "ALTER PUBLICATION p ADD TABLES IN SCHEMA ob",
		"schema dropped from the publication and added again")
}

// TestWatchPublicationQuietOnTableChanges: the sound side. An ALTER
// PUBLICATION ... SET TABLE with the same tables (as infrastructure-as-code
// tools re-issue on every apply) keeps the pg_publication_rel rows, and
// adding or dropping another table changes neither the outbox's row nor
// the publication's: the watch raises no alarm.
func TestWatchPublicationQuietOnTableChanges(t *testing.T) {
	t.Parallel()
	exec, read, _ := watchServer(t, "CREATE PUBLICATION p FOR TABLE ob.outbox WITH (publish = 'insert')")
	for _, sql := range []string{
		"ALTER PUBLICATION p SET TABLE ob.outbox",
		"ALTER PUBLICATION p ADD TABLE ob.other",
		"ALTER PUBLICATION p DROP TABLE ob.other",
	} {
		exec(sql)
		if problems := read(); len(problems) > 0 {
			t.Fatalf("after %s: false alarm: %v", sql, problems)
		}
	}
}
