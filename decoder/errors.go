package decoder

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/failure"
)

// ErrMissingColumn is wrapped by the *Error returned when the outbox table's
// Relation message lacks a required column.
var ErrMissingColumn = errors.New("required column missing")

// ErrUnexpectedRelation is wrapped by the *Error returned for a row of a
// table that is not the outbox: the publication publishes a table walrelay
// does not read, which may be a partition of the outbox whose rows would
// otherwise pass unpublished.
var ErrUnexpectedRelation = errors.New("the publication publishes a table that is not the outbox")

// Error is a message the decoder cannot turn into events without risking a
// lost event; the pipeline must stop (its kind is failure.Fatal).
type Error struct {
	WALStart pglogrepl.LSN // position of the XLogData that carried the message
	MsgType  byte          // the pgoutput message type byte, 0 when empty
	Err      error
}

func (e *Error) Error() string {
	if e.MsgType == 0 {
		return fmt.Sprintf("decode pgoutput message at %s: %v", e.WALStart, e.Err)
	}
	return fmt.Sprintf("decode pgoutput %q message at %s: %v", e.MsgType, e.WALStart, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// FailureKind is failure.Fatal: skipping the message could lose events.
func (e *Error) FailureKind() failure.Kind { return failure.Fatal }
