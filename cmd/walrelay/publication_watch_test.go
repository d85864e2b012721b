package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// streamingWithRows starts walrelay with e and has it publish 5 rows of a
// writer of 3 aggregates (seed), which it returns: the state before the
// publication is changed under the running walrelay.
func streamingWithRows(t *testing.T, e env, conn *pgx.Conn, col *kafkatest.Collector, seed uint64) (*proc, *writer) {
	t.Helper()
	p := streaming(t, e)
	w := newWriter(3, seed)
	if err := w.write(t.Context(), conn, 5, 5); err != nil {
		t.Fatal(err)
	}
	waitAll(t, col, w.written(), time.Minute)
	return p, w
}

// TestOutboxRemovedFromPublicationStops: an outbox table taken out of the
// publication while walrelay streams (ALTER PUBLICATION ... DROP TABLE,
// rows, ADD TABLE) raises no error and no WARNING on any PostgreSQL
// version: pgoutput passes the rows between over. walrelay checks the
// publication while it runs and stops, naming the cause and the reconcile
// that republishes those rows; check then names the table as added after
// the slot's position, and so does run at start; put back and reconciled,
// every row is on its topic.
func TestOutboxRemovedFromPublicationStops(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc)
	p, w := streamingWithRows(t, e, conn, col, 91)
	execSQL(t, conn, "ALTER PUBLICATION walrelay_outbox DROP TABLE outbox")
	if err := w.write(t.Context(), conn, 5, 5); err != nil {
		t.Fatal(err)
	}
	code := p.exit(30 * time.Second)
	last := lastLine(p.out.String())
	if code != 1 || !strings.Contains(last, "the outbox public.outbox was removed from publication walrelay_outbox") ||
		!strings.Contains(last, "walrelay reconcile --table public.outbox ") {
		t.Fatalf("exit %d, want a stop naming the outbox taken out of the publication and the reconcile:\n%s", code, tail(p.out.String(), 3000))
	}
	execSQL(t, conn, "ALTER PUBLICATION walrelay_outbox ADD TABLE outbox")
	if _, out := runCmd(t, e, "check"); !strings.Contains(checkLine(out, "late"), "public.outbox was added to publication walrelay_outbox after slot walrelay's position") {
		t.Fatalf("check says nothing of the table added after the slot's position:\n%s", out)
	}
	if err := w.write(t.Context(), conn, 5, 5); err != nil {
		t.Fatal(err)
	}
	p = streaming(t, e)
	defer func() { p.signal(syscall.SIGTERM); p.exit(time.Minute) }()
	if !strings.Contains(p.out.String(), "public.outbox was added to publication walrelay_outbox after slot walrelay's position") {
		t.Fatalf("run says nothing at start of the table added after the slot's position:\n%s", tail(p.out.String(), 3000))
	}
	if code, out := runCmd(t, e, "reconcile", "--table", "public.outbox", "--all", "--replay", "--yes"); code != 0 {
		t.Fatalf("reconcile: exit %d\n%s", code, tail(out, 2000))
	}
	waitAll(t, col, w.written(), time.Minute)
}

// TestOutboxRemovedAndAddedAgainStops: the outbox taken out of the
// publication and put back between two of walrelay's checks passes the
// rows between over just the same; its pg_publication_rel row is new, and
// walrelay stops on it.
func TestOutboxRemovedAndAddedAgainStops(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	p, w := streamingWithRows(t, baseEnv(pg, kc), conn, col, 92)
	execSQL(t, conn, "ALTER PUBLICATION walrelay_outbox DROP TABLE outbox")
	if err := w.write(t.Context(), conn, 5, 5); err != nil {
		t.Fatal(err)
	}
	execSQL(t, conn, "ALTER PUBLICATION walrelay_outbox ADD TABLE outbox")
	code := p.exit(30 * time.Second)
	if last := lastLine(p.out.String()); code != 1 || !strings.Contains(last, "the outbox public.outbox was removed from publication walrelay_outbox and added again") {
		t.Fatalf("exit %d, want a stop naming the outbox taken out of the publication and put back:\n%s", code, tail(p.out.String(), 3000))
	}
}

// TestQuietSessionStopsOnPublicationGap: PostgreSQL 18 tells of a
// publication it cannot see as of a transaction with a WARNING only; with
// client_min_messages=error in the DSN's options (or on the role, the
// database) walrelay still receives it, and stops when the publication is
// dropped and created again under it rather than pass the rows between
// over. (On 17 and before the gap is an error.)
func TestQuietSessionStopsOnPublicationGap(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	sep := "?"
	if strings.Contains(pg.DSN, "?") {
		sep = "&"
	}
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_DSN", pg.DSN+sep+"options=-c%20client_min_messages%3Derror")
	p, w := streamingWithRows(t, e, conn, col, 29)
	execSQL(t, conn, "DROP PUBLICATION walrelay_outbox")
	if err := w.write(t.Context(), conn, 5, 5); err != nil {
		t.Fatal(err)
	}
	execSQL(t, conn, "CREATE PUBLICATION walrelay_outbox FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)")
	if err := w.write(t.Context(), conn, 5, 5); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := conn.QueryRow(t.Context(), "SHOW server_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	code := p.exit(30 * time.Second)
	if last := lastLine(p.out.String()); code != 1 || !strings.Contains(last, "publication walrelay_outbox was dropped") {
		t.Fatalf("PostgreSQL %s, client_min_messages=error: exit %d, want a stop naming the publication dropped; slot confirmed at %s:\n%s",
			v, code, slotConfirmed(t, conn, "walrelay"), tail(p.out.String(), 3000))
	}
}
