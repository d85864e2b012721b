package produce

import (
	"context"
	"time"
)

// The lanes send the rounds of at-least-once mode (a Sender): the
// flusher routes each record of a round to its broker's lane without
// waiting, and releases them together at the round's end; each lane then
// runs rounds of its own (Lanes.run).

func (ls *Lanes) Until() time.Time { return time.Time{} }

func (ls *Lanes) Holds() bool { return false }

func (ls *Lanes) BeginRound() { clear(ls.leaders) }

// Send routes a record to its lane (one sent alone, too: its lane sends
// it alone).
func (ls *Lanes) Send(ctx context.Context, it Item) error {
	ls.send(ctx, it, ls.leaders)
	return nil
}

// Barrier returns once every record routed to a lane, in this round or an
// earlier one, is answered, and has the partition counts learnt again.
func (ls *Lanes) Barrier(ctx context.Context) {
	ls.drain(ctx)
	ls.forget()
}

func (ls *Lanes) EndRound(context.Context) { ls.release() }

func (ls *Lanes) Closed() {}
