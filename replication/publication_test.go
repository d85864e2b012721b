package replication

import (
	"strings"
	"testing"
)

// TestPublicationOfSeveralTables: EnsurePublication creates one publication
// of every outbox table, and adds to an existing one the tables it lacks;
// CheckPublication names, per table, a table it lacks, a column list that
// leaves out a column of that table's layout, and a table that is none of
// them.
func TestPublicationOfSeveralTables(t *testing.T) {
	t.Parallel()
	_, conn := serverConn(t)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE SCHEMA billing; CREATE TABLE outbox (id int PRIMARY KEY, payload text);
		CREATE TABLE billing.events (event_id int PRIMARY KEY, body text); CREATE TABLE audit (id int PRIMARY KEY, body text); CREATE TABLE other (id int)`); err != nil {
		t.Fatal(err)
	}
	two := Outbox{Publication: "p", Tables: []Table{{Schema: "public", Name: "outbox", Columns: []string{"id", "payload"}},
		{Schema: "billing", Name: "events", Columns: []string{"event_id", "body"}}}}
	if created, added, err := EnsurePublication(ctx, conn, two); err != nil || !created || added != nil {
		t.Fatalf("create: %v %v %v", created, added, err)
	}
	if p, err := Publication(ctx, conn, "p"); err != nil || strings.Join(p.Tables, ",") != "billing.events,public.outbox" {
		t.Fatalf("publication %+v %v", p, err)
	}
	three := two
	three.Tables = append(three.Tables, Table{Schema: "public", Name: "audit", Columns: []string{"id"}})
	if problems, err := CheckPublication(ctx, conn, three); err != nil || len(problems) != 1 ||
		!strings.HasPrefix(problems[0], "it does not publish the outbox public.audit: ALTER PUBLICATION p ADD TABLE public.audit (the rows already written to it are not in the stream") ||
		!strings.Contains(problems[0], "walrelay reconcile --table public.audit --all --replay --yes") {
		t.Fatalf("a table missing: %q %v", problems, err)
	}
	if created, added, err := EnsurePublication(ctx, conn, three); err != nil || created || strings.Join(added, ",") != "public.audit" {
		t.Fatalf("add: %v %v %v", created, added, err)
	}
	if problems, err := CheckPublication(ctx, conn, three); err != nil || len(problems) != 0 {
		t.Fatalf("after the add: %q %v", problems, err)
	}
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION p SET TABLE outbox, billing.events (event_id), audit, other"); err != nil {
		t.Fatal(err)
	}
	problems, err := CheckPublication(ctx, conn, three)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(problems, "\n")
	for _, want := range []string{"its column list of billing.events leaves out body", "it publishes other, which is not an outbox table: ALTER PUBLICATION p DROP TABLE other"} {
		if !strings.Contains(got, want) {
			t.Fatalf("problems %q lack %q", problems, want)
		}
	}
	if len(problems) != 2 {
		t.Fatalf("problems %q", problems)
	}
}
