package poll

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink"
)

// TestHoldBack: in one batch, a row behind an earlier row of its aggregate
// that goes to another topic or to a partition of its own is held for the
// next claim, and so is every later row of that aggregate; rows of one
// aggregate on one topic go together; ordering none holds nothing.
func TestHoldBack(t *testing.T) {
	t.Parallel()
	cc, _ := pgx.ParseConfig("postgres://u@127.0.0.1:1/db")
	for _, ordering := range []string{OrderAggregate, OrderNone} {
		p, err := New(Config{ConnConfig: cc, Ordering: ordering, Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}}})
		if err != nil {
			t.Fatal(err)
		}
		tb := &table{name: "public.outbox"}
		mk := func(id, aggType, agg string, placed bool) *row {
			return &row{t: tb, id: id, e: &event.Event{ID: id, AggregateType: aggType, AggregateID: agg, HasPartition: placed}}
		}
		rows := []*row{
			mk("a1", "order", "A", false), mk("b1", "order", "B", false), mk("a2", "order", "A", false),
			mk("a3", "invoice", "A", false), mk("a4", "order", "A", false),
			mk("c1", "order", "C", true), mk("c2", "order", "C", false),
		}
		var got []string
		for _, r := range p.holdBack(rows) {
			got = append(got, r.id)
		}
		want := []string{"a1", "b1", "a2", "c1"}
		if ordering == OrderNone {
			want = []string{"a1", "b1", "a2", "a3", "a4", "c1", "c2"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("ordering %s: published %v, want %v", ordering, got, want)
		}
		p.sink.Close()
	}
}

// TestSortRows: insert order is created_at, then the id, as a number when
// both are numbers.
func TestSortRows(t *testing.T) {
	t.Parallel()
	at := time.Unix(100, 0)
	rows := []*row{{id: "10", created: at}, {id: "9", created: at}, {id: "b", created: at.Add(-time.Microsecond)}, {id: "a", created: at.Add(time.Second)}}
	sortRows(rows)
	var got []string
	for _, r := range rows {
		got = append(got, r.id)
	}
	if want := []string{"b", "9", "10", "a"}; !slices.Equal(got, want) {
		t.Fatalf("sorted %v, want %v", got, want)
	}
}
