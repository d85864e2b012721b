package checkpoint

import (
	"math/rand/v2"
	"testing"

	"github.com/jackc/pglogrepl"
)

type event struct {
	txn *Txn
	idx int // index of its transaction in commit order
}

// TestConfirmedNeverPassesUnacked drives random transaction sizes, random ack
// orders, keepalives and stream resets, and checks after every step that the
// confirmed LSN covers only fully acknowledged transactions and never moves
// backwards; once every ack is in it must equal the last commit's end LSN.
func TestConfirmedNeverPassesUnacked(t *testing.T) {
	t.Parallel()
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, seed*7+1))
		start := pglogrepl.LSN(0x1000)
		tr := New(start)
		var (
			ends    []pglogrepl.LSN // end LSN per transaction, in commit order
			commits []pglogrepl.LSN // commit LSN per transaction
			sizes   []int           // events per transaction
			open    = -1            // index of the open transaction
			pending []int           // unacked events per transaction
			queue   []event         // events produced, not yet acked
			lsn     = start
			prev    = start
		)
		check := func(step string) {
			t.Helper()
			c := tr.Confirmed()
			if c < prev {
				t.Fatalf("seed %d %s: confirmed moved back from %s to %s", seed, step, prev, c)
			}
			prev = c
			for i, commit := range commits {
				if (pending[i] > 0 || i == open) && c > commit {
					t.Fatalf("seed %d %s: confirmed %s passes transaction %d (commit %s) with %d unacked events", seed, step, c, i, commit, pending[i])
				}
			}
		}
		ackSome := func(n int) {
			for ; n > 0 && len(queue) > 0; n-- {
				j := rng.IntN(len(queue))
				e := queue[j]
				queue[j] = queue[len(queue)-1]
				queue = queue[:len(queue)-1]
				e.txn.Ack()
				if e.idx >= 0 {
					pending[e.idx]--
				}
				check("ack")
			}
		}
		txns := 1 + rng.IntN(60)
		for range txns {
			lsn += pglogrepl.LSN(1 + rng.IntN(500))
			x, err := tr.Begin(lsn)
			if err != nil {
				t.Fatal(err)
			}
			size := rng.IntN(8)
			if rng.IntN(10) == 0 {
				size = 200 + rng.IntN(300)
			}
			idx := len(ends)
			ends = append(ends, 0)
			commits = append(commits, lsn)
			open = idx
			sizes = append(sizes, size)
			pending = append(pending, 0)
			for range size {
				x.Add()
				pending[idx]++
				queue = append(queue, event{x, idx})
				if rng.IntN(4) == 0 {
					ackSome(rng.IntN(3))
				}
			}
			if rng.IntN(25) == 0 {
				// The connection drops mid-transaction. The tracker forgets
				// every unconfirmed transaction; their late acks may still
				// arrive. The server then resends each of them whole, from
				// the confirmed position on, the open one included.
				tr.Reset(tr.Confirmed(), nil)
				open = -1
				check("reset")
				c := tr.Confirmed()
				n := len(ends)
				for i := range n {
					if ends[i] != 0 && ends[i] <= c && i != idx {
						continue // confirmed: the server skips it
					}
					if pending[i] == 0 && ends[i] == 0 && i != idx {
						continue // already replaced by a resent copy
					}
					for k := range queue {
						if queue[k].idx == i {
							queue[k].idx = -1
						}
					}
					size := sizes[i]
					end := ends[i]
					pending[i], ends[i] = 0, 0
					if i == idx {
						lsn += pglogrepl.LSN(1 + rng.IntN(100))
						end = lsn
					}
					rx, err := tr.Begin(commits[i])
					if err != nil {
						t.Fatal(err)
					}
					j := len(ends)
					ends = append(ends, 0)
					commits = append(commits, commits[i])
					pending = append(pending, 0)
					sizes = append(sizes, size)
					open = j
					for range size {
						rx.Add()
						pending[j]++
						queue = append(queue, event{rx, j})
					}
					if err := rx.Commit(end); err != nil {
						t.Fatal(err)
					}
					open = -1
					ends[j] = end
					check("resend")
				}
				continue
			}
			lsn += pglogrepl.LSN(1 + rng.IntN(100))
			if err := x.Commit(lsn); err != nil {
				t.Fatal(err)
			}
			open = -1
			ends[idx] = lsn
			check("commit")
			if rng.IntN(5) == 0 {
				// A keepalive's WAL end: the server has read that far, so
				// every later commit lies beyond it.
				lsn += pglogrepl.LSN(rng.IntN(50))
				tr.AdvanceIfIdle(lsn)
				check("idle")
			}
			ackSome(rng.IntN(10))
		}
		ackSome(len(queue))
		if got := tr.InFlight(); got != 0 {
			t.Fatalf("seed %d: in flight %d after every ack", seed, got)
		}
		last := start
		for _, e := range ends {
			last = max(last, e)
		}
		if got := tr.Confirmed(); got < last {
			t.Fatalf("seed %d: confirmed %s after every ack, want at least the last end %s", seed, got, last)
		}
		if len(tr.fifo) != 0 {
			t.Fatalf("seed %d: %d entries left in the FIFO", seed, len(tr.fifo))
		}
	}
}

func TestIdleAdvancesOnlyWhenNothingInFlight(t *testing.T) {
	t.Parallel()
	tr := New(100)
	tr.AdvanceIfIdle(200)
	if got := tr.Confirmed(); got != 200 {
		t.Fatalf("idle with nothing in flight: confirmed %s, want 200", got)
	}
	x, _ := tr.Begin(300)
	tr.AdvanceIfIdle(400)
	if got := tr.Confirmed(); got != 200 {
		t.Fatalf("idle with an open transaction: confirmed %s, want 200", got)
	}
	x.Add()
	if err := x.Commit(310); err != nil {
		t.Fatal(err)
	}
	tr.AdvanceIfIdle(400)
	if got := tr.Confirmed(); got != 200 {
		t.Fatalf("idle with an unacked event: confirmed %s, want 200", got)
	}
	x.Ack()
	if got := tr.Confirmed(); got != 310 {
		t.Fatalf("after the ack: confirmed %s, want 310", got)
	}
	tr.AdvanceIfIdle(150)
	if got := tr.Confirmed(); got != 310 {
		t.Fatalf("idle behind the confirmed LSN moved it back to %s", got)
	}
}

func TestBeginWhileOpenIsAnError(t *testing.T) {
	t.Parallel()
	tr := New(0)
	if _, err := tr.Begin(10); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Begin(20); err == nil {
		t.Fatal("second Begin without Commit or Reset: no error")
	}
	tr.Reset(0, nil)
	if _, err := tr.Begin(20); err != nil {
		t.Fatalf("Begin after Reset: %v", err)
	}
}

func TestFailedEventBlocksUntilResent(t *testing.T) {
	t.Parallel()
	tr := New(100)
	x, _ := tr.Begin(200)
	x.Add()
	x.Add()
	if err := x.Commit(210); err != nil {
		t.Fatal(err)
	}
	x.Ack()
	x.Fail()
	if got, n := tr.Confirmed(), tr.InFlight(); got != 100 || n != 0 {
		t.Fatalf("after a failed event: confirmed %s in flight %d, want 100 and 0", got, n)
	}
	tr.Reset(100, nil) // the stream restarts; the server resends the transaction
	y, _ := tr.Begin(200)
	y.Add()
	if err := y.Commit(210); err != nil {
		t.Fatal(err)
	}
	y.Ack()
	if got := tr.Confirmed(); got != 210 {
		t.Fatalf("after the resent copy was acknowledged: confirmed %s, want 210", got)
	}
}

// TestResetHandsOnTheAdvances: after Reset(from, fn), fn hears each LSN the
// confirmed one moves to (commits acknowledged, an idle keepalive), and an
// acknowledgement of a transaction dropped by the Reset tells it nothing.
func TestResetHandsOnTheAdvances(t *testing.T) {
	t.Parallel()
	tr := New(0)
	old, err := tr.Begin(50)
	if err != nil {
		t.Fatal(err)
	}
	old.Add()
	var heard []pglogrepl.LSN
	tr.Reset(10, func(lsn pglogrepl.LSN) { heard = append(heard, lsn) })
	old.Ack() // of the earlier session: dropped
	x, err := tr.Begin(100)
	if err != nil {
		t.Fatal(err)
	}
	x.Add()
	if err := x.Commit(120); err != nil {
		t.Fatal(err)
	}
	x.Ack()
	tr.AdvanceIfIdle(300)
	if len(heard) != 2 || heard[0] != 120 || heard[1] != 300 {
		t.Fatalf("heard %v, want [0/78 0/12C]", heard)
	}
}
