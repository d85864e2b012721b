package sink

import "github.com/walrelay/walrelay/event"

// poison is why an event is dead-lettered when it is published again.
type poison struct {
	reason string
	cause  error
	omit   bool // the dead letter goes without its value (it was refused as too large)
}

// poison notes that e goes to the dead-letter topic when it is published
// again, for reason and cause; omit: without its value.
func (t *txns) poison(e *event.Event, reason string, cause error, omit bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.poisoned == nil {
		t.poisoned = map[suspect]poison{}
	}
	p := t.poisoned[suspectOf(e)]
	if p.cause == nil {
		p.reason, p.cause = reason, cause
	}
	p.omit = p.omit || omit
	t.poisoned[suspectOf(e)] = p
}

// poisonOf returns why e goes to the dead-letter topic, if it does.
func (t *txns) poisonOf(e *event.Event) (poison, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.poisoned) == 0 {
		return poison{}, false
	}
	p, ok := t.poisoned[suspectOf(e)]
	return p, ok
}

// omitValue reports whether e's dead letter goes without its value.
func (t *txns) omitValue(e *event.Event) bool {
	p, ok := t.poisonOf(e)
	return ok && p.omit
}

// unpoison forgets e once its dead letter is committed.
func (t *txns) unpoison(e *event.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.poisoned, suspectOf(e))
}
