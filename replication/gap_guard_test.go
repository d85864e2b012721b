package replication

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestPublicationGapSeenWithClientMinMessagesError: PostgreSQL 18 skips a
// publication it cannot see with a WARNING instead of an error, and a
// session whose client_min_messages is error (the DSN's options, ALTER ROLE
// or ALTER DATABASE ... SET) would never receive it. PublicationGap still
// sees the gap: its session asks for warnings as a startup parameter, which
// beats the role's and the database's settings. (Up to 17 the gap is an
// error, which client_min_messages does not hide.)
func TestPublicationGapSeenWithClientMinMessagesError(t *testing.T) {
	t.Parallel()
	_, conn := serverConn(t)
	ctx := t.Context()
	exec := execer(t, conn)
	exec("CREATE TABLE outbox (id int PRIMARY KEY)")
	exec("SELECT pg_create_logical_replication_slot('cmm', 'pgoutput')")
	exec("INSERT INTO outbox VALUES (1)")
	exec("CREATE PUBLICATION late FOR TABLE outbox WITH (publish = 'insert')")
	exec("INSERT INTO outbox VALUES (2)")
	exec("ALTER DATABASE " + pgx.Identifier{conn.Config().Database}.Sanitize() + " SET client_min_messages = error")
	cfg := conn.Config()
	cfg.RuntimeParams["client_min_messages"] = "error"
	quiet, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close(context.Background())
	var v string
	if err := quiet.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if behind, err := PublicationGap(ctx, quiet, "cmm", "late"); err != nil || !behind {
		t.Fatalf("PostgreSQL %s, client_min_messages=error in the DSN and on the database: PublicationGap = %v, %v; want a gap", v, behind, err)
	}
}

// TestReplicationSessionReceivesWarnings: the replication session asks for
// warnings (PostgreSQL 18's skipped-publication WARNING is how the stream
// learns of a gap) whatever the DSN, the role or the database say; a lower
// level (notice, debug) given as the DSN's client_min_messages is kept.
func TestReplicationSessionReceivesWarnings(t *testing.T) {
	t.Parallel()
	pg, conn := serverConn(t)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" SET client_min_messages = error"); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(pg.DSN, "?") {
		sep = "&"
	}
	for _, tc := range []struct{ set, want string }{
		{"", "warning"},
		{"options=-c%20client_min_messages%3Derror", "warning"},
		{"options=-c%20client_min_messages%3Dnotice", "warning"},
		{"client_min_messages=error", "warning"},
		{"client_min_messages=notice", "notice"},
		{"client_min_messages=debug1", "debug1"},
	} {
		dsn := pg.DSN
		if tc.set != "" {
			dsn += sep + tc.set
		}
		cfg, err := ReplicationConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		res, err := rc.Exec(ctx, "SHOW client_min_messages").ReadAll()
		rc.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := string(res[0].Rows[0][0]); got != tc.want {
			t.Errorf("DSN with %q (error on the database): the replication session's is %q; want %q", tc.set, got, tc.want)
		}
	}
}

// TestSkippedPublicationWarningLocalized: PostgreSQL 18's WARNING `skipped
// loading publication "…"` is translated into the server's lc_messages; the
// stream recognizes it by its SQLSTATE (55000) and the quoted publication
// name, in any language, and stops. On 18 the test reads the real
// WARNING's SQLSTATE first.
func TestSkippedPublicationWarningLocalized(t *testing.T) {
	t.Parallel()
	_, conn := serverConn(t)
	ctx := t.Context()
	code := "55000"
	var v int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v >= 180000 {
		exec := execer(t, conn)
		for _, sql := range []string{"CREATE TABLE outbox (id int PRIMARY KEY)", "SELECT pg_create_logical_replication_slot('loc', 'pgoutput')",
			"INSERT INTO outbox VALUES (1)", "CREATE PUBLICATION late FOR TABLE outbox"} {
			exec(sql)
		}
		var got *pgconn.Notice
		cfg := conn.Config()
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if strings.Contains(n.Message, `"late"`) {
				got = n
			}
		}
		peek, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer peek.Close(context.Background())
		if _, err := peek.Exec(ctx, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('loc', NULL, NULL, 'proto_version', '1', 'publication_names', 'late')"); err != nil {
			t.Fatal(err)
		}
		if got == nil {
			t.Fatal("no skipped-publication WARNING on PostgreSQL 18")
		}
		t.Logf("PostgreSQL %d's WARNING: severity %s, SQLSTATE %s, %q", v, got.Severity, got.Code, got.Message)
		code = got.Code
	}
	ss := &Session{s: &Stream{cfg: Config{Slot: "walrelay", Publication: "walrelay_outbox"}}}
	for _, tc := range []struct {
		name string
		msg  pgproto3.NoticeResponse
		stop bool
	}{
		{"english", pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: code,
			Message: `skipped loading publication "walrelay_outbox"`}, true},
		{"german", pgproto3.NoticeResponse{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: code,
			Message: `Laden der Publikation »walrelay_outbox« übersprungen`}, true},
		{"japanese", pgproto3.NoticeResponse{Severity: "警告", SeverityUnlocalized: "WARNING", Code: code,
			Message: `パブリケーション"walrelay_outbox"の読み込みをスキップしました`}, true},
		{"another publication", pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: code,
			Message: `skipped loading publication "walrelay_outbox_2"`}, false},
		{"another SQLSTATE", pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000",
			Message: `something about "walrelay_outbox"`}, false},
	} {
		_, _, err := ss.change(&tc.msg)
		if (err != nil) != tc.stop {
			t.Errorf("%s: %q (SQLSTATE %s): error %v; want a stop: %v", tc.name, tc.msg.Message, tc.msg.Code, err, tc.stop)
		}
	}
}

// lateTableServer gives a test a server with the tables outbox and outbox2,
// a publication p of outbox alone, and the slot add created after it, and
// returns a connection and its execer.
func lateTableServer(t *testing.T) (*pgx.Conn, func(sql string)) {
	t.Helper()
	_, conn := serverConn(t)
	exec := execer(t, conn)
	exec("CREATE TABLE outbox (id int PRIMARY KEY); CREATE TABLE outbox2 (id int PRIMARY KEY)")
	exec("CREATE PUBLICATION p FOR TABLE outbox WITH (publish = 'insert')")
	exec("SELECT pg_create_logical_replication_slot('add', 'pgoutput')")
	return conn, exec
}

// TestTablesAddedAfterSlot: a table added to the publication (ALTER
// PUBLICATION ADD TABLE) after the slot's position is a gap: pgoutput
// decodes each transaction with the publication's tables as of its commit,
// so a row written to the table between the slot's position and the ALTER
// is passed over, with no error and no WARNING. TablesAddedAfterSlot names
// such a table; a table published before the slot was created is none.
func TestTablesAddedAfterSlot(t *testing.T) {
	t.Parallel()
	conn, exec := lateTableServer(t)
	ctx := t.Context()
	if added, err := TablesAddedAfterSlot(ctx, conn, "add", "p"); err != nil || len(added) != 0 {
		t.Fatalf("before the ALTER: TablesAddedAfterSlot = %v, %v; want none", added, err)
	}
	exec("INSERT INTO outbox2 VALUES (1)") // after the slot, before the table is published
	exec("ALTER PUBLICATION p ADD TABLE outbox2")
	exec("INSERT INTO outbox2 VALUES (2)")
	var inserts int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('add', NULL, NULL,
		'proto_version', '1', 'publication_names', 'p') WHERE substr(data, 1, 1) = 'I'::bytea`).Scan(&inserts); err != nil {
		t.Fatal(err)
	}
	if inserts != 1 {
		t.Fatalf("the stream holds %d of the 2 rows of outbox2; the test expects the row before the ALTER passed over", inserts)
	}
	added, err := TablesAddedAfterSlot(ctx, conn, "add", "p")
	if err != nil || !slices.Equal(added, []string{"public.outbox2"}) {
		t.Fatalf("TablesAddedAfterSlot = %v, %v; want [public.outbox2]", added, err)
	}
	// Missing slot or publication: nothing to say.
	for _, sp := range [][2]string{{"nosuch", "p"}, {"add", "nosuch"}} {
		if added, err := TablesAddedAfterSlot(ctx, conn, sp[0], sp[1]); err != nil || len(added) != 0 {
			t.Fatalf("TablesAddedAfterSlot(%s, %s) = %v, %v; want none", sp[0], sp[1], added, err)
		}
	}
}

// TestTablesAddedAfterSlotSurvivesAPublicationRewrite: second review of
// #37 (review37b). A table added to the publication after the slot's
// position stays listed after any later rewrite of the publication's own
// row (SET (publish = ...) with the same value, as a deploy tool re-applies
// it; OWNER TO; RENAME and back). It used to be listed only while that row
// was older than the slot's catalog_xmin: the rewrite moved the case to
// PublicationGap, whose copy test found the publication visible and said
// nothing either, and the rows passed over were told of by nothing.
func TestTablesAddedAfterSlotSurvivesAPublicationRewrite(t *testing.T) {
	t.Parallel()
	conn, exec := lateTableServer(t)
	ctx := t.Context()
	exec("INSERT INTO outbox2 VALUES (1)") // after the slot, before the table is published: passed over
	exec("ALTER PUBLICATION p ADD TABLE outbox2")
	for _, rewrite := range []string{
		"ALTER PUBLICATION p SET (publish = 'insert')", // the same value, re-applied
		"ALTER PUBLICATION p OWNER TO CURRENT_USER",
		"ALTER PUBLICATION p RENAME TO p2; ALTER PUBLICATION p2 RENAME TO p",
	} {
		exec(rewrite)
		added, err := TablesAddedAfterSlot(ctx, conn, "add", "p")
		if err != nil {
			t.Fatal(err)
		}
		behind, err := PublicationGap(ctx, conn, "add", "p")
		if err != nil {
			t.Fatal(err)
		}
		if behind {
			t.Fatalf("after %s: PublicationGap says the publication is behind the slot; it is not", rewrite)
		}
		if !slices.Equal(added, []string{"public.outbox2"}) {
			t.Fatalf("after %s: TablesAddedAfterSlot = %v: row 1 of outbox2 was passed over and nothing says so any more; want [public.outbox2]", rewrite, added)
		}
	}
}
