package failure

import (
	"errors"
	"fmt"
	"testing"
)

type slotBusy struct{}

func (slotBusy) Error() string     { return "busy" }
func (slotBusy) FailureKind() Kind { return Retriable }

func TestOf(t *testing.T) {
	base := errors.New("boom")
	cases := []struct {
		name string
		err  error
		want Kind
	}{
		{"unmarked", base, Retriable},
		{"fatal", Mark(Fatal, base), Fatal},
		{"wrapped fatal", fmt.Errorf("context: %w", Mark(Fatal, base)), Fatal},
		{"per-event", Mark(PerEvent, base), PerEvent},
		{"outermost mark wins", Mark(Retriable, Mark(Fatal, base)), Retriable},
		{"a type's own kind", fmt.Errorf("x: %w", slotBusy{}), Retriable},
		{"joined: the first known", errors.Join(base, Mark(Fatal, base)), Fatal},
	}
	for _, c := range cases {
		if got := Of(c.err); got != c.want {
			t.Errorf("%s: Of = %v, want %v", c.name, got, c.want)
		}
	}
	if Mark(Fatal, nil) != nil {
		t.Error("Mark(Fatal, nil) is not nil")
	}
	if IsFatal(nil) || IsRetriable(nil) || IsPerEvent(nil) {
		t.Error("nil has a kind")
	}
	if !errors.Is(Mark(Fatal, base), base) {
		t.Error("a marked error does not unwrap to its cause")
	}
	if got := Mark(Fatal, base).Error(); got != "boom" {
		t.Errorf("message %q, want the cause's", got)
	}
}
