package poll

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/sink"
)

// claimed is one claim of one table, and once Kafka answered, its marks.
type claimed struct {
	t     *table
	claim string
	rows  []*row

	m                   *marks
	sent, retried, dead int
}

func (p *Poller) sendOne(ctx context.Context, r *row, done sink.Done) { p.sink.Publish(ctx, r.e, done) }

// publish sends rows through send and waits for every answer, renewing the
// claims' leases every third of a lease meanwhile.
func (p *Poller) publish(ctx context.Context, conn *pgx.Conn, rows []*row, claims []*claimed, send func(context.Context, *row, sink.Done)) {
	var wg sync.WaitGroup
	p.inFlight.Add(int64(len(rows)))
	defer func() {
		p.outMu.Lock()
		for _, r := range rows {
			r.answered, r.d, r.err = r.cb.ok, r.cb.d, r.cb.err
		}
		p.outMu.Unlock()
	}()
	for _, r := range rows {
		wg.Add(1)
		p.outMu.Lock()
		r.cb = answer{}
		p.outMu.Unlock()
		send(ctx, r, func(d sink.Delivery, err error) {
			p.outMu.Lock()
			r.cb = answer{true, d, err}
			p.outMu.Unlock()
			p.inFlight.Add(-1)
			if err == nil {
				p.cfg.Hooks.Acked(r.e.Source, d.Topic, d.DeadLetter, r.created)
			} else if !collateral(err) {
				kind := "transient"
				if failure.IsFatal(err) {
					kind = "fatal"
				}
				p.cfg.Hooks.PublishError(kind)
			}
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	renew := time.NewTicker(p.cfg.Lease / 3)
	defer renew.Stop()
	stopping := ctx.Done()
	var giveUp <-chan time.Time
	for {
		select {
		case <-done:
			return
		case <-stopping:
			// The shutdown timeout ended: records already sent may still
			// be answered a moment later; then the rows not answered go
			// back to PENDING (another claim may send them twice).
			stopping, giveUp = nil, time.After(2*time.Second)
		case <-giveUp:
			return
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, p.cfg.Lease/3)
			for _, c := range claims {
				if err := c.t.renew(rctx, conn, c); err != nil {
					p.log.Warn("renew the leases of a claim", "table", c.t.name, "claim", c.claim, "err", err)
				}
			}
			cancel()
		}
	}
}

// collateral reports whether err failed a record only because an earlier
// one failed, or because walrelay is stopping: not the row's own failure.
func collateral(err error) bool {
	return errors.Is(err, sink.ErrNotSent) || errors.Is(err, context.Canceled) || errors.Is(err, kgo.ErrAborting)
}

// mark records the fate of a claim's rows, where the claim still holds
// them.
func (p *Poller) mark(ctx context.Context, conn *pgx.Conn, c *claimed) error {
	if c.m == nil {
		c.m = &marks{}
		c.sent, c.retried, c.dead = p.fates(c.m, c.rows)
	}
	start := time.Now()
	n, err := c.t.mark(ctx, conn, c.claim, c.m)
	if err != nil {
		return err
	}
	lost := len(c.rows) - int(n)
	if lost > 0 {
		p.log.Warn("rows claimed again by another worker before they were marked (their lease expired): they were sent twice", "table", c.t.name, "claim", c.claim, "rows", lost)
	}
	p.cfg.PollHooks.Marked(c.t.name, time.Since(start), c.sent, c.retried, c.dead, lost)
	// The rows parked behind the rows just sent go with the next claim (a
	// failure is only logged: the sweep releases them within sweepEvery).
	if c.m.sentOrDead() {
		released, err := c.t.releaseMarked(ctx, conn, c.m.ids)
		p.cfg.PollHooks.Released(c.t.name, released, err)
		if err != nil {
			p.log.Warn("release the rows parked behind the rows just sent (the next sweep does)", "table", c.t.name, "err", err)
		}
	}
	return nil
}

// fates fills m with the fate of each row as Kafka answered it, and counts
// the rows to be SENT, back to PENDING and DEAD.
func (p *Poller) fates(m *marks, rows []*row) (sent, retried, dead int) {
	for _, r := range rows {
		switch {
		case r.held:
			m.add(r.id, "PENDING", 0, 1, "")
			retried++
		case !r.answered:
			// Never answered (the shutdown timeout ended the wait): another
			// claim takes it now, and may send it twice.
			m.add(r.id, "PENDING", 0, 1, "")
			retried++
		case r.err == nil && r.d.DeadLetter != "":
			m.add(r.id, "DEAD", 0, 0, "dead-lettered ("+r.d.DeadLetter+")"+errText(r.e.Invalid))
			dead++
		case r.err == nil:
			m.add(r.id, "SENT", 0, 0, "")
			sent++
		case collateral(r.err):
			m.add(r.id, "PENDING", 0, 1, "")
			retried++
		case sink.Held(r.err):
			// An answer a healthy cluster gives for a while (a partition
			// without its leader, UNKNOWN_SERVER_ERROR): backed off, but
			// not an attempt, so that it never makes the row DEAD.
			base := float64(int(1) << min(r.attempts, 10))
			m.add(r.id, "PENDING", base+rand.Float64()*base/4, 1, r.err.Error())
			retried++
		default:
			base := float64(int(1) << min(r.attempts, 10))
			m.add(r.id, "PENDING", base+rand.Float64()*base/4, 0, r.err.Error())
			retried++
		}
	}
	return sent, retried, dead
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// release gives claimed rows back at once (PENDING, the attempt not
// counted), best effort: their leases expire otherwise.
func (p *Poller) release(conn *pgx.Conn, claims []*claimed) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, c := range claims {
		var m marks
		for _, r := range c.rows {
			m.add(r.id, "PENDING", 0, 1, "")
		}
		if _, err := c.t.mark(ctx, conn, c.claim, &m); err != nil {
			p.log.Warn("release claimed rows", "table", c.t.name, "err", err)
		}
	}
}

// marks are the columns of a mark statement's unnest.
type marks struct {
	ids, statuses, errs []string
	delays              []float64
	undo                []int32
}

// sentOrDead reports whether m sets a row SENT or DEAD.
func (m *marks) sentOrDead() bool {
	for _, s := range m.statuses {
		if s == "SENT" || s == "DEAD" {
			return true
		}
	}
	return false
}

func (m *marks) add(id, status string, delay float64, undo int32, err string) {
	m.ids = append(m.ids, id)
	m.statuses = append(m.statuses, status)
	m.delays = append(m.delays, delay)
	m.undo = append(m.undo, undo)
	m.errs = append(m.errs, err)
}
