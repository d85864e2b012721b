package outbox_test

import (
	"testing"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/outbox"
)

// TestWriteVersion: with a version column in the layout (migrate creates
// it as bigint), each event's Version is written in it.
func TestWriteVersion(t *testing.T) {
	t.Parallel()
	l := decoder.Layout{VersionColumn: "aggregate_version", HeaderColumns: []string{"tenant"}}
	conn := setup(t, l)
	ctx := t.Context()
	w, err := outbox.New(outbox.Config{Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteBatch(ctx, tx, []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", Type: "OrderCreated", Payload: []byte(`{}`), Version: 1, Headers: map[string]string{"tenant": "acme"}},
		{AggregateType: "order", AggregateID: "o-1", Type: "OrderPaid", Payload: []byte(`{}`), Version: 9007199254740993},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var got []int64
	rows, err := conn.Query(ctx, "SELECT aggregate_version FROM outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 9007199254740993 {
		t.Fatalf("versions written %v, want [1 9007199254740993]", got)
	}
}
