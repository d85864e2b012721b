package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestPublicationGap: a slot created before its publication, with a row
// written between them, cannot be decoded with it (PublicationGap says so,
// as the stream would fail); a slot created after the publication, or
// advanced past its creation, can; a slot whose catalog_xmin is older than
// the publication but that had confirmed past it before (Debezium running
// on while walrelay's publication is created) can, which only the decode of
// a copy tells; a missing slot or publication is no gap.
func TestPublicationGap(t *testing.T) {
	t.Parallel()
	_, conn := serverConn(t)
	ctx := t.Context()
	exec := execer(t, conn)
	gap := func(slot, pub string, want bool) {
		t.Helper()
		if got, err := PublicationGap(ctx, conn, slot, pub); err != nil || got != want {
			t.Fatalf("PublicationGap(%s, %s) = %v, %v; want %v", slot, pub, got, err, want)
		}
	}
	exec("CREATE TABLE outbox (id int PRIMARY KEY); CREATE TABLE other (id int)")
	// Debezium's way: its slot, its publication of every table.
	exec("CREATE PUBLICATION dbz_publication FOR ALL TABLES")
	exec("SELECT pg_create_logical_replication_slot('gap_dbz', 'pgoutput')")
	exec("INSERT INTO outbox VALUES (1)")
	exec("CREATE PUBLICATION late FOR TABLE outbox WITH (publish = 'insert')")
	exec("INSERT INTO outbox VALUES (2)")
	gap("gap_dbz", "dbz_publication", false)
	gap("gap_dbz", "late", true)
	// The copies are gone: only the slots of the test remain.
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'walrelay_gap_%'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("copies left: %d %v", n, err)
	}
	// The stream fails there, as PublicationGap said (up to PostgreSQL
	// 17), or skips the publication with a WARNING, and the rows with it
	// (18).
	ccfg := conn.Config()
	var warned string
	ccfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { warned += n.Message }
	peek, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer peek.Close(context.Background())
	_, err = peek.Exec(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('gap_dbz', NULL, NULL, 'proto_version', '1', 'publication_names', 'late')`)
	if err == nil && !strings.Contains(warned, `skipped loading publication "late"`) {
		t.Fatalf("decoding the slot with the late publication worked, without a warning (%q)", warned)
	}
	t.Logf("decoding the slot with the late publication: %v %s", err, warned)
	// Debezium reads on and confirms past the creation: its catalog_xmin
	// may stay behind the publication, its position is past it.
	exec("SELECT count(*) FROM pg_logical_slot_get_binary_changes('gap_dbz', NULL, NULL, 'proto_version', '1', 'publication_names', 'dbz_publication')")
	var suspect bool
	if err := conn.QueryRow(ctx, `SELECT age(p.xmin) <= age(s.catalog_xmin) FROM pg_replication_slots s, pg_publication p
		WHERE s.slot_name = 'gap_dbz' AND p.pubname = 'late'`).Scan(&suspect); err != nil {
		t.Fatal(err)
	}
	t.Logf("past the creation, the catalog_xmin test alone would say %v (true: only the decode of the copy tells)", map[bool]string{true: "maybe", false: "no gap"}[suspect])
	gap("gap_dbz", "late", false)
	// A slot created after the publication.
	exec("SELECT pg_create_logical_replication_slot('gap_after', 'pgoutput')")
	exec("INSERT INTO outbox VALUES (3)")
	gap("gap_after", "late", false)
	// A publication dropped and created again under a kept slot.
	exec("DROP PUBLICATION late")
	exec("INSERT INTO outbox VALUES (4)")
	exec("CREATE PUBLICATION late FOR TABLE outbox WITH (publish = 'insert')")
	gap("gap_after", "late", true)
	// Moved past it.
	exec("SELECT pg_replication_slot_advance('gap_after', pg_current_wal_lsn())")
	gap("gap_after", "late", false)
	gap("gap_none", "late", false)
	gap("gap_after", "none", false)
	if err := PublicationGapError("s", "p"); !errors.Is(err, ErrPublicationAfterSlot) {
		t.Fatal(err)
	}
	exec("SELECT pg_drop_replication_slot('gap_dbz'); SELECT pg_drop_replication_slot('gap_after')")
}

// TestSuggestedCommandsQuoteTheTable: the reconcile a refusal suggests
// passes a table whose name a shell would read (a ';', a '$(…)') as one
// argument once pasted, and a plain name as it is.
func TestSuggestedCommandsQuoteTheTable(t *testing.T) {
	t.Parallel()
	msg := TablesAddedAfterSlotError("s", "p", []string{"public.x; rm -rf ~", "public.outbox"})
	for _, want := range []string{`walrelay reconcile --table 'public.x; rm -rf ~' --all`, "walrelay reconcile --table public.outbox --all"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q not in %s", want, msg)
		}
	}
}

// TestPublicationMissingInAnyLanguage: the server's "publication does not
// exist" (42704) is recognised by its SQLSTATE and the publication's name
// alone in the message, whatever lc_messages translated it into, so that
// check, run and slot resync explain it (a publication created after the
// slot's position) in German as in English. Before, the English word
// "publication" was required: on a German server the gap was "could not
// tell" and slot resync refused.
func TestPublicationMissingInAnyLanguage(t *testing.T) {
	for _, c := range []struct {
		code, message string
		want          bool
	}{
		{"42704", `publication "walrelay_outbox" does not exist`, true},
		{"42704", `Publikation »walrelay_outbox« existiert nicht`, true},
		{"42704", `la publicación «walrelay_outbox» no existe`, true},
		{"42704", `Publikation »walrelay_outbox_2« existiert nicht`, false},
		{"42704", `type "walrelay_outbox_t" does not exist`, false},
		{"42P01", `relation "walrelay_outbox" does not exist`, false},
	} {
		err := fmt.Errorf("stream: %w", &pgconn.PgError{Code: c.code, Message: c.message})
		if got := isPublicationMissing(err, "walrelay_outbox"); got != c.want {
			t.Errorf("%s %q: %v, want %v", c.code, c.message, got, c.want)
		}
		if got := publicationVanished(err, "walrelay_outbox") != nil; got != c.want {
			t.Errorf("publicationVanished %s %q: %v, want %v", c.code, c.message, got, c.want)
		}
	}
}
