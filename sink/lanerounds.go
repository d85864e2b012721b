package sink

import (
	"context"
	"time"

	"github.com/walrelay/walrelay/sink/produce"
)

// The lanes send the rounds of at-least-once mode (a produce.Sender): the
// flusher routes each record of a round to its broker's lane without
// waiting, and releases them together at the round's end; each lane then
// runs rounds of its own (lanes.run).

func (ls *lanes) Until() time.Time { return time.Time{} }

func (ls *lanes) Holds() bool { return false }

func (ls *lanes) BeginRound() { clear(ls.leaders) }

// Send routes a record to its lane (one sent alone, too: its lane sends
// it alone).
func (ls *lanes) Send(ctx context.Context, it produce.Item) error {
	ls.send(ctx, it, ls.leaders)
	return nil
}

// Barrier returns once every record routed to a lane, in this round or an
// earlier one, is answered, and has the partition counts learnt again.
func (ls *lanes) Barrier(ctx context.Context) {
	ls.drain(ctx)
	ls.forget()
}

func (ls *lanes) EndRound(context.Context) { ls.release() }

func (ls *lanes) Closed() {}
