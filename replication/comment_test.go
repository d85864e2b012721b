package replication

import (
	"testing"
)

// TestPublicationCommentWithoutStandardStrings: recordSlot writes the
// publication's comment back with the slot added, keeping the rest of it
// character for character, in a session with standard_conforming_strings
// off, when the comment holds backslashes and quotes; nothing of the
// comment is read as SQL. Before, the comment was written as a literal
// with doubled quotes only: with the setting off, its \' closed the
// literal early and the rest was read as SQL (here a syntax error, so the
// slot was silently never recorded).
func TestPublicationCommentWithoutStandardStrings(t *testing.T) {
	t.Parallel()
	_, conn := serverConn(t)
	ctx := t.Context()
	const comment = `the billing team's relay \ C:\outbox\'; CREATE TABLE injected (); SELECT '`
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE outbox`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `COMMENT ON PUBLICATION p IS $$`+comment+`$$`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET standard_conforming_strings = off; SET escape_string_warning = off"); err != nil {
		t.Fatal(err)
	}
	recordSlot(ctx, conn, "p", "walrelay")
	got, _, err := publicationComment(ctx, conn, "p")
	if err != nil {
		t.Fatal(err)
	}
	if want := comment + "\n" + slotMarker + "walrelay"; got != want {
		t.Errorf("comment\n%q, want\n%q", got, want)
	}
	var injected bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('injected') IS NOT NULL").Scan(&injected); err != nil || injected {
		t.Errorf("the comment's text ran as SQL: table injected exists (%v)", err)
	}
	if ok, err := SlotRecorded(ctx, conn, "p", "walrelay"); err != nil || !ok {
		t.Errorf("SlotRecorded = %v, %v", ok, err)
	}
}
