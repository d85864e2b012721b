package decoder

import (
	"bufio"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

var update = flag.Bool("update", false, "capture testdata/stream.hex from a real PostgreSQL and rewrite testdata/stream.golden")

// captureSQL is what the capture runs: outbox inserts with every supported
// value kind, a NULL key, a rolled-back and a deleted row, ignored changes,
// a table outside the publication and logical messages.
const captureSQL = `
CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255), aggregateid varchar(255), type varchar(255),
	payload jsonb, tenant int8, amount numeric, created_at timestamptz, urgent bool);
CREATE TABLE other (id int PRIMARY KEY);
CREATE PUBLICATION pub FOR TABLE outbox WITH (publish = 'insert, update, delete, truncate');
SELECT pg_create_logical_replication_slot('golden', 'pgoutput');
INSERT INTO outbox VALUES ('0b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11', 'order', 'o-1', 'OrderCreated', '{"total": 12.50, "items": [1, 2]}',
	42, 12345678901234567890.000000000000000001, '2026-12-02 10:00:00.5+00', true);
BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, amount) VALUES ('1b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11', 'order', 'o-1', 'OrderPaid', NULL, 'NaN');
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, amount) VALUES ('2b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11', 'order', NULL, 'Broken', '{}', '-Infinity');
INSERT INTO other VALUES (1);
UPDATE outbox SET type = 'X' WHERE id = '0b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11';
COMMIT;
BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('3b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11', 'order', 'o-2', 'RolledBack');
ROLLBACK;
BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('4b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11', 'order', 'o-3', 'Deleted');
DELETE FROM outbox WHERE id = '4b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11';
COMMIT;
SELECT pg_logical_emit_message(true, 'walrelay', '{"id": "5b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11", "aggregatetype": "invoice", "aggregateid": "i-1", "type": "Issued", "payload": {"n": 1}}');
SELECT pg_logical_emit_message(false, 'walrelay.heartbeat', 'beat');
TRUNCATE outbox;
`

func TestGolden(t *testing.T) {
	t.Parallel()
	if *update {
		capture(t)
	}
	f, err := os.Open("testdata/stream.hex")
	if err != nil {
		t.Fatalf("%v (capture it with go test ./decoder -run TestGolden -update)", err)
	}
	defer f.Close()
	d, err := New(Config{Layout: Layout{HeaderColumns: []string{"tenant", "amount", "created_at", "urgent"}}, Messages: true})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lsn, data := parseHexLine(t, sc.Text())
		m, err := d.Decode(lsn, data)
		if err != nil {
			t.Fatalf("decode message at %s: %v", lsn, err)
		}
		fmt.Fprintf(&out, "%s %s\n", lsn, render(m))
	}
	got := out.String()
	if *update {
		if err := os.WriteFile("testdata/stream.golden", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/stream.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("decoded stream differs from testdata/stream.golden:\n%s", got)
	}
}

func parseHexLine(t testing.TB, line string) (pglogrepl.LSN, []byte) {
	lsnText, hexData, ok := strings.Cut(line, " ")
	if !ok {
		t.Fatalf("malformed line %q", line)
	}
	lsn, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		t.Fatal(err)
	}
	data, err := hex.DecodeString(hexData)
	if err != nil {
		t.Fatal(err)
	}
	return lsn, data
}

// render prints a message with the fields that vary only by capture (xid,
// times, LSNs) kept, so the golden file shows what the decoder reads.
func render(m Message) string {
	switch m := m.(type) {
	case Begin:
		return fmt.Sprintf("begin final=%s xid=%d", m.FinalLSN, m.Xid)
	case Commit:
		return fmt.Sprintf("commit commit=%s end=%s", m.CommitLSN, m.EndLSN)
	case Ignored:
		return "ignored " + m.Kind
	case EventMessage:
		var hs []string
		for _, h := range m.Headers {
			if h.Value == nil {
				hs = append(hs, h.Key+"=null")
			} else {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
		}
		inv := ""
		if m.Invalid != nil {
			inv = " invalid=" + fmt.Sprintf("%q", m.Invalid.Error())
		}
		return fmt.Sprintf("event id=%s aggtype=%s aggid=%s type=%s payload=%q headers=[%s] source=%s xid=%d tx=%v%s",
			m.ID, m.AggregateType, m.AggregateID, m.Type, m.Payload, strings.Join(hs, " "), m.Source, m.Xid, m.Transactional, inv)
	}
	return fmt.Sprintf("%T", m)
}

// capture runs captureSQL on a throwaway server and writes the slot's pgoutput
// messages to testdata/stream.hex, one "LSN hex" line each.
func capture(t *testing.T) {
	srv := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, stmt := range strings.Split(captureSQL, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	// Set as the replication session pins them, so values have its form.
	if _, err := conn.Exec(ctx, "SET DateStyle = ISO; SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET bytea_output = hex"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes('golden', NULL, NULL,
		'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')`)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for rows.Next() {
		var lsn string
		var data []byte
		if err := rows.Scan(&lsn, &data); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s\n", lsn, hex.EncodeToString(data))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("testdata/stream.hex", []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
