package txn

import (
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/event"
)

// Poison is why an event goes to the dead-letter topic when it is
// published again: the broker refused it on its own in a transaction,
// which that refusal doomed, and the next transaction must commit.
type Poison struct {
	Reason string
	Cause  error
	Omit   bool // the dead letter goes without its value (it was refused as too large)
}

// Poisons are the events (by their WAL position and id) that go to the
// dead-letter topic when they are published again. The zero value is
// empty; its methods are safe for concurrent use.
type Poisons struct {
	mu  sync.Mutex
	set map[poisonKey]Poison
}

type poisonKey struct {
	at pglogrepl.LSN
	id string
}

func keyOf(e *event.Event) poisonKey { return poisonKey{e.WALStart, e.ID} }

// Add notes that e goes to the dead-letter topic when it is published
// again, for reason and cause (the first noted stays); omit: without its
// value.
func (p *Poisons) Add(e *event.Event, reason string, cause error, omit bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.set == nil {
		p.set = map[poisonKey]Poison{}
	}
	x := p.set[keyOf(e)]
	if x.Cause == nil {
		x.Reason, x.Cause = reason, cause
	}
	x.Omit = x.Omit || omit
	p.set[keyOf(e)] = x
}

// Of returns why e goes to the dead-letter topic, if it does.
func (p *Poisons) Of(e *event.Event) (Poison, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.set) == 0 {
		return Poison{}, false
	}
	x, ok := p.set[keyOf(e)]
	return x, ok
}

// OmitValue reports whether e's dead letter goes without its value.
func (p *Poisons) OmitValue(e *event.Event) bool {
	x, ok := p.Of(e)
	return ok && x.Omit
}

// Forget forgets e once its dead letter is committed.
func (p *Poisons) Forget(e *event.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.set, keyOf(e))
}
