// Package failure is walrelay's one error vocabulary: every error that
// crosses a package boundary on the data path says what the relay does
// about it, in the spirit of franz-go's kerr.IsRetriable and pgconn's
// SafeToRetry.
//
//   - Retriable: the relay ends the replication session and opens the next,
//     which the server streams from the confirmed position, so the event is
//     sent again, in order. An error that says nothing is retriable: a
//     restart loses nothing, and a repeating one is bounded elsewhere (the
//     backoff, the relay's count of persistent refusals).
//   - PerEvent: this event alone cannot be delivered; it goes to the
//     dead-letter topic and the stream goes on.
//   - Fatal: retrying does not fix it (authorization, a missing object, a
//     message that does not decode, a slot that was lost); the relay stops
//     without confirming past it and returns it.
//
// A package marks an error with Mark, or gives a type of its own a
// FailureKind method (decoder.Error, replication.SlotActiveError); Of reads
// the kind of any error.
package failure

import "errors"

// Kind says what the relay does about an error.
type Kind uint8

const (
	// Retriable errors restart the stream from the confirmed position.
	Retriable Kind = iota
	// PerEvent errors send the event to the dead-letter topic.
	PerEvent
	// Fatal errors stop the relay.
	Fatal
)

func (k Kind) String() string {
	switch k {
	case Retriable:
		return "retriable"
	case PerEvent:
		return "per-event"
	case Fatal:
		return "fatal"
	}
	return "unknown"
}

// Error is an error marked with its Kind.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// FailureKind returns e.Kind.
func (e *Error) FailureKind() Kind { return e.Kind }

// Mark returns err marked with kind; nil stays nil.
func Mark(kind Kind, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: kind, Err: err}
}

// kinded is an error that knows its kind.
type kinded interface {
	error
	FailureKind() Kind
}

// Of returns the kind of err: that of the first error in its chain that
// knows its kind (an *Error, or a type with a FailureKind method), else
// Retriable. Of(nil) is Retriable.
func Of(err error) Kind {
	var k kinded
	if errors.As(err, &k) {
		return k.FailureKind()
	}
	return Retriable
}

// IsFatal reports whether err stops the relay.
func IsFatal(err error) bool { return err != nil && Of(err) == Fatal }

// IsPerEvent reports whether err concerns one event, which belongs on the
// dead-letter topic.
func IsPerEvent(err error) bool { return err != nil && Of(err) == PerEvent }

// IsRetriable reports whether err is one that a restart from the confirmed
// position may fix.
func IsRetriable(err error) bool { return err != nil && Of(err) == Retriable }
