package migrations

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/decoder"
)

// TestExistingRowsSent: migrate --poll --existing-rows sent over a table
// that holds rows (published by the WAL source) makes them SENT with a
// sent_at (prune deletes them in time), and new rows are PENDING with no
// sent_at; a value other than sent or pending is refused.
func TestExistingRowsSent(t *testing.T) {
	conn := conns(t, 1)[0]
	ctx := t.Context()
	if _, err := Apply(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'order', 'o', 'T', '{}' FROM generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyPollWith(ctx, conn, decoder.Config{}, PollOptions{ExistingRows: "maybe"}); err == nil {
		t.Fatal("existing rows \"maybe\" accepted")
	}
	res, err := ApplyPollWith(ctx, conn, decoder.Config{}, PollOptions{ExistingRows: ExistingSent})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent["public.outbox"] != 3 || len(res.Pending) != 0 {
		t.Fatalf("sent %v, pending %v; want 3 sent", res.Sent, res.Pending)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'o', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	var sent, sentAt, pending, pendingAt int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'SENT'), count(sent_at) FILTER (WHERE status = 'SENT'),
		count(*) FILTER (WHERE status = 'PENDING'), count(sent_at) FILTER (WHERE status = 'PENDING') FROM outbox`).Scan(&sent, &sentAt, &pending, &pendingAt); err != nil {
		t.Fatal(err)
	}
	if sent != 3 || sentAt != 3 || pending != 1 || pendingAt != 0 {
		t.Fatalf("SENT %d (with sent_at %d), PENDING %d (with sent_at %d); want 3 (3), 1 (0)", sent, sentAt, pending, pendingAt)
	}
}

// TestInvalidIndexGivenToRebuild: on a table too large to index in the
// migration, an INVALID poll index is given back as the statements that
// drop it and build it again without blocking the writers.
func TestInvalidIndexGivenToRebuild(t *testing.T) {
	conn := conns(t, 1)[0]
	ctx := t.Context()
	polled(t, conn)
	was := indexRowsAtOnce
	indexRowsAtOnce = 10
	t.Cleanup(func() { indexRowsAtOnce = was })
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'order', 'o', 'T', '{}' FROM generate_series(1, 11)`); err != nil {
		t.Fatal(err)
	}
	n := PollNamesOf(decoder.Config{}.WithDefaults().Layouts()[0])
	if _, err := conn.Exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)", n.UnsentIndex); err != nil {
		t.Fatal(err)
	}
	res, err := ApplyPoll(ctx, conn, decoder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got := res.Unbuilt["public.outbox"]
	if len(got) != 1 || !strings.HasPrefix(got[0], `DROP INDEX CONCURRENTLY IF EXISTS "public"."`+n.UnsentIndex+`"; CREATE INDEX CONCURRENTLY IF NOT EXISTS "`+n.UnsentIndex+`"`) {
		t.Fatalf("unbuilt %q; want the drop then the build of %s", got, n.UnsentIndex)
	}
}
