package migrations_test

import (
	"bytes"
	"testing"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
)

// TestEmitPrefixUnderBothSettings: walrelay_emit, whose body holds the
// message prefix as a literal and is parsed in its caller's session,
// emits under exactly the configured prefix, with a backslash and a
// quote in it, for a caller with standard_conforming_strings on and for
// one with it off. Before, the prefix was written with doubled quotes
// only: a caller with the setting off got a syntax error. A prefix with
// $$ is written whole (the body's dollar tag is one it does not hold).
func TestEmitPrefixUnderBothSettings(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	const prefix = `it's\walrelay`
	if _, err := migrations.Apply(ctx, conn, decoder.Config{MessagePrefix: prefix, Messages: true}); err != nil {
		t.Fatal(err)
	}
	var src string
	if err := conn.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'walrelay_emit'").Scan(&src); err != nil {
		t.Fatal(err)
	}
	if src != migrations.EmitMessageSource(prefix) {
		t.Fatalf("the function's source is not EmitMessageSource's text:\n%s", src)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('quote_test', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	for _, scs := range []string{"on", "off"} {
		if _, err := conn.Exec(ctx, "SET standard_conforming_strings = "+scs+"; SET escape_string_warning = off"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT walrelay_emit(gen_random_uuid(), 'orders', 'o-1', 'Placed', '{}')"); err != nil {
			t.Errorf("standard_conforming_strings %s: walrelay_emit: %v", scs, err)
		}
	}
	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_get_binary_changes('quote_test', NULL, NULL,
		'proto_version', '1', 'publication_names', 'walrelay_outbox', 'messages', 'true')`)
	if err != nil {
		t.Fatal(err)
	}
	var messages int
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		if len(data) > 0 && data[0] == 'M' {
			messages++
			if !bytes.Contains(data, []byte(prefix+"\x00")) {
				t.Errorf("a message under another prefix than %q: %q", prefix, data)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if messages != 2 {
		t.Errorf("%d messages, want 2 (one per setting)", messages)
	}
	// A prefix with $$ (or any dollar tag) is written whole: the body's
	// tag is one it does not hold.
	for _, prefix := range []string{"a$$b", "a$body$b"} {
		if _, err := migrations.Apply(ctx, conn, decoder.Config{MessagePrefix: prefix, Messages: true}); err != nil {
			t.Errorf("prefix %q: %v", prefix, err)
			continue
		}
		if err := conn.QueryRow(ctx, "SELECT prosrc FROM pg_proc WHERE proname = 'walrelay_emit'").Scan(&src); err != nil {
			t.Fatal(err)
		}
		if src != migrations.EmitMessageSource(prefix) {
			t.Errorf("prefix %q: the function's source is not EmitMessageSource's text:\n%s", prefix, src)
		}
	}
}
