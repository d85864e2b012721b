package txn

import (
	"errors"
	"testing"

	"github.com/walrelay/walrelay/event"
)

// TestPoisons: an event noted twice keeps its first reason and cause, goes
// without its value once either note says so, is told apart from another
// event of the same id at another WAL position, and is forgotten.
func TestPoisons(t *testing.T) {
	t.Parallel()
	var p Poisons
	e := &event.Event{ID: "e-1", WALStart: 10}
	other := &event.Event{ID: "e-1", WALStart: 20}
	if _, ok := p.Of(e); ok {
		t.Fatal("an empty set poisons an event")
	}
	first := errors.New("first")
	p.Add(e, "record_too_large", first, false)
	p.Add(e, "invalid_record", errors.New("second"), true)
	x, ok := p.Of(e)
	if !ok || x.Reason != "record_too_large" || !errors.Is(x.Cause, first) || !x.Omit || !p.OmitValue(e) {
		t.Fatalf("poison %+v, %v; want the first reason and cause, omitted", x, ok)
	}
	if _, ok := p.Of(other); ok {
		t.Fatal("an event of the same id at another WAL position is poisoned")
	}
	p.Forget(e)
	if _, ok := p.Of(e); ok {
		t.Fatal("a forgotten event is still poisoned")
	}
}
