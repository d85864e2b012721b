package main

import (
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// Second review of #37's fixes (review37b): slot resync's wait for the
// transactions older than the publication (resyncTarget).

// TestResyncWaitsForEveryTransactionOlderThanThePublication: a transaction
// that took its xid after CREATE PUBLICATION's, and wrote the outbox before
// the publication committed, is decoded (at its commit) without the
// publication. resyncTarget must wait for it, however new its xid: it used
// to wait only for the xids below the snapshot's xmax (the last completed
// xid + 1), so it returned a target with that transaction running, and
// the moved slot failed with `publication "p" does not exist`.
func TestResyncWaitsForEveryTransactionOlderThanThePublication(t *testing.T) {
	pg := pgtest.Start(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	execSQL(t, conn, "CREATE TABLE ob (id int PRIMARY KEY)",
		"SELECT pg_create_logical_replication_slot('rs', 'pgoutput')")
	ddl := connect(t, pg.DSN)
	app := connect(t, pg.DSN)
	execSQL(t, ddl, "BEGIN", "CREATE PUBLICATION p FOR TABLE ob WITH (publish = 'insert')") // xid P
	execSQL(t, app, "BEGIN", "INSERT INTO ob VALUES (1)")                                   // xid P+1, before the publication commits
	execSQL(t, ddl, "COMMIT")
	execSQL(t, conn, "CHECKPOINT")
	var snap string
	if err := conn.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&snap); err != nil {
		t.Fatal(err)
	}
	target, err := resyncTarget(ctx, conn, 2*time.Second)
	if err == nil {
		execSQL(t, conn, "SELECT pg_replication_slot_advance('rs', '"+target.String()+"')")
		execSQL(t, app, "COMMIT")
		var n int
		err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('rs', NULL, NULL,
			'proto_version', '1', 'publication_names', 'p')`).Scan(&n)
		t.Fatalf("resyncTarget returned %s with a transaction older than the publication still running (snapshot %s); "+
			"the moved slot, decoded after that transaction's commit: %d messages, err %v", target, snap, n, err)
	}
	if !strings.Contains(err.Error(), "still running") {
		t.Fatalf("resyncTarget: %v; want the transactions still running named", err)
	}
	// Once it has ended, the wait passes and the moved slot decodes.
	execSQL(t, app, "COMMIT")
	target, err = resyncTarget(ctx, conn, 10*time.Second)
	if err != nil {
		t.Fatalf("resyncTarget after the older transaction ended: %v", err)
	}
	execSQL(t, conn, "SELECT pg_replication_slot_advance('rs', '"+target.String()+"')", "INSERT INTO ob VALUES (2)")
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('rs', NULL, NULL,
		'proto_version', '1', 'publication_names', 'p') WHERE substr(data, 1, 1) = 'I'::bytea`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the moved slot: %d inserts, %v; want 1", n, err)
	}
}

// TestResyncOnAQuietServerWithAnOpenTransaction: on a quiet server (the
// application stopped for the switch-over) with one session idle in a
// transaction whose WAL is at the end, nothing flushes the WAL up to the
// insert position: resync used to refuse with "the WAL is not flushed",
// every time. Its own committed marker transaction flushes it.
func TestResyncOnAQuietServerWithAnOpenTransaction(t *testing.T) {
	pg := pgtest.Start(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, "CREATE DATABASE probe_other")
	other := connect(t, pg.DSNFor("probe_other"))
	execSQL(t, other, "CREATE TABLE busy (id int)", "BEGIN", "INSERT INTO busy VALUES (1)") // idle in transaction, WAL at the tail
	if _, err := resyncTarget(t.Context(), conn, 2*time.Second); err != nil {
		t.Fatalf("resyncTarget refused on a quiet server with one open transaction: %v", err)
	}
}

// TestResyncIgnoresAnotherDatabasesTransactions: the slot never decodes
// another database's transactions, so one running there (a report, a
// pool's idle-in-transaction connection, a prepared transaction) must not
// make resync wait and refuse; it used to (pg_current_snapshot() is
// cluster-wide).
func TestResyncIgnoresAnotherDatabasesTransactions(t *testing.T) {
	pg := pgtest.Start(t)
	conn := connect(t, pg.DSN)
	execSQL(t, conn, "CREATE DATABASE probe_other")
	other := connect(t, pg.DSNFor("probe_other"))
	execSQL(t, other, "CREATE TABLE busy (id int)", "BEGIN", "INSERT INTO busy VALUES (1)")
	execSQL(t, conn, "CREATE TABLE later (id int)") // a newer transaction completes: the other one is now below xmax
	if _, err := resyncTarget(t.Context(), conn, 2*time.Second); err != nil {
		t.Fatalf("resyncTarget refused because of a transaction in another database, which the slot never decodes: %v", err)
	}
}
