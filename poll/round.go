package poll

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/textcut"
	"github.com/walrelay/walrelay/sink"
)

// row is one claimed row and, once Kafka answered, its fate.
type row struct {
	t        *table
	claim    string
	id       string
	attempts int
	created  time.Time
	e        *event.Event

	// Kafka's answer, as publish left it: read by the poller's goroutine
	// only.
	answered bool
	d        sink.Delivery
	err      error
	// The answer as the callback gives it, under the poller's outMu.
	cb answer
	// held is set for a row not published in this round (holdBack).
	held bool
}

type answer struct {
	ok  bool
	d   sink.Delivery
	err error
}

// claimTable releases t's parked rows whose aggregate is no longer blocked,
// then claims t's due rows under claim. A release that fails is logged and
// counted (Hooks.Released), and the claim runs all the same: the release
// only moves rows back into the claims' index, and one that failed every
// round must not stop every claim. Neither is cut by a stop: a claim
// cancelled after it committed would leave its rows SENDING, unknown to
// anyone, until the lease ends.
func (p *Poller) claimTable(ctx context.Context, conn *pgx.Conn, t *table, claim string) ([]*row, int, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// The parked rows of aggregates no longer blocked first: the claim
	// takes them at once. The mark releases those behind the rows it
	// sends; this sweep, for the rest, runs once per sweepEvery.
	var released int64
	var err error
	if time.Since(t.swept) >= sweepEvery {
		t.swept = time.Now()
		released, err = t.sweep(cctx, conn)
		p.cfg.PollHooks.Released(t.name, released, err)
	}
	switch {
	case err != nil:
		p.log.Warn("release parked rows (the claim runs all the same; the next round tries again)", "table", t.name, "err", err)
		if conn.IsClosed() {
			return nil, 0, fmt.Errorf("release parked rows: %w", err)
		}
	case released > 0:
		p.log.Debug("parked rows released", "table", t.name, "rows", released)
	}
	cctx2, cancel2 := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel2()
	return t.claim(cctx2, conn, claim)
}

// round claims from every table, publishes what it claimed, waits for
// Kafka's answers (renewing the leases meanwhile) and marks the rows. It
// returns how many rows it claimed. db is replaced when its connection was
// lost.
func (p *Poller) round(ctx, produceCtx context.Context, db **pgx.Conn) (int, error) {
	if (*db).IsClosed() {
		c, err := p.connect(ctx, true)
		if err != nil {
			return 0, err
		}
		*db = c
		p.reconn.Add(1)
		if err := p.describe(ctx, c); err != nil {
			return 0, err
		}
	}
	conn := *db
	roundAt := time.Now()
	for len(p.unmarked) > 0 {
		if err := p.mark(ctx, conn, p.unmarked[0]); err != nil {
			return 0, fmt.Errorf("mark rows of %s: %w", p.unmarked[0].t.name, err)
		}
		p.unmarked = p.unmarked[1:]
	}
	var rows []*row
	var claims []*claimed
	for _, t := range p.tables {
		claim := p.nextClaim()
		start := time.Now()
		// Not cut by a stop: a claim cancelled after it committed would
		// leave its rows SENDING, unknown to anyone, until the lease ends.
		rs, expired, err := p.claimTable(ctx, conn, t, claim)
		if err != nil {
			// Rows claimed from the tables before this one are released
			// (their leases would hold them otherwise).
			p.release(conn, claims)
			return 0, changed(fmt.Errorf("claim rows of %s: %w", t.name, err), t.name)
		}
		p.cfg.PollHooks.Claimed(t.name, len(rs), expired, time.Since(start))
		if len(rs) > 0 {
			claims = append(claims, &claimed{t: t, claim: claim, rows: rs})
			rows = append(rows, rs...)
		}
	}
	if len(rows) == 0 {
		return 0, nil
	}
	claimedAt := time.Now()
	p.publish(produceCtx, conn, p.holdBack(rows), claims, p.sendOne)
	publishedAt := time.Now()
	// A failed publish: the sink sends nothing more until Abort, which
	// waits for what was sent before.
	var retry []*row
	failed := false
	for _, r := range rows {
		if r.err != nil {
			failed = true
			if !collateral(r.err) && !sink.Held(r.err) && r.attempts >= p.cfg.MaxAttempts {
				retry = append(retry, r)
			}
		}
	}
	if failed {
		actx, cancel := context.WithTimeout(produceCtx, 30*time.Second)
		err := p.sink.Abort(actx)
		cancel()
		if err != nil {
			p.log.Warn("settle the failed records", "err", err)
		}
	}
	if len(retry) > 0 && produceCtx.Err() == nil {
		// Out of attempts: to the dead-letter topic.
		for _, r := range retry {
			r.e.Invalid = fmt.Errorf("attempt %d of %d failed: %w", r.attempts, p.cfg.MaxAttempts, r.err)
		}
		p.publish(produceCtx, conn, retry, claims, func(ctx context.Context, r *row, done sink.Done) {
			p.sink.DeadLetter(ctx, r.e, ReasonMaxAttempts, r.e.Invalid, done)
		})
		if slices.ContainsFunc(retry, func(r *row) bool { return r.err != nil }) {
			actx, cancel := context.WithTimeout(produceCtx, 30*time.Second)
			_ = p.sink.Abort(actx)
			cancel()
		}
	}
	p.checkOrder(rows)
	// The marks go through even when ctx ends: the rows Kafka acknowledged
	// must not be sent again.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for i, c := range claims {
		if err := p.mark(mctx, conn, c); err != nil {
			p.unmarked = append(p.unmarked, claims[i:]...)
			return len(rows), changed(fmt.Errorf("mark rows of %s: %w", c.t.name, err), c.t.name)
		}
	}
	p.log.Debug("round", "rows", len(rows), "claim", claimedAt.Sub(roundAt), "publish", publishedAt.Sub(claimedAt), "mark", time.Since(publishedAt))
	return len(rows), nil
}

// nextClaim returns a new claim id: the worker id, the token of this
// start and the claim's number. The token makes it unique to this Poller
// even where worker ids are not (containers that share a hostname and run
// as pid 1, one WALRELAY_POLL_WORKER_ID for several instances), so that a
// zombie's mark never matches a later owner's claim.
func (p *Poller) nextClaim() string {
	return p.cfg.WorkerID + ":" + p.start + ":" + strconv.FormatUint(p.claims.Add(1), 10)
}

// holdBack returns the rows to publish now: all of them, but for a row
// behind an earlier row of its aggregate that goes to another topic (or to
// a partition of its own): that one is not published (it goes back to
// PENDING, its attempt not counted), so that an earlier row's failure
// cannot let it overtake. Rows of an aggregate on one topic and key are
// kept in order by the sink: after a failure it sends nothing more of the
// partition.
func (p *Poller) holdBack(rows []*row) []*row {
	if p.cfg.Ordering != OrderAggregate {
		return rows
	}
	type stream struct {
		table, agg string
	}
	topic := map[stream]string{}
	out := rows[:0:0]
	for _, r := range rows {
		k := stream{r.t.name, r.e.AggregateID}
		tp := p.sink.Topic(r.e)
		if r.e.HasPartition {
			tp = "" // a partition of its own: no order with the others
		}
		first, seen := topic[k]
		switch {
		case !seen:
			topic[k] = tp
		case first == "" || first != tp:
			r.held = true
			topic[k] = "" // and every later row of the aggregate
			continue
		}
		out = append(out, r)
	}
	return out
}

// checkOrder reports a row acknowledged on a partition after an earlier
// row of its aggregate failed there: consumers would see the later one
// first. The sink's rounds prevent it; this sees it if they do not.
func (p *Poller) checkOrder(rows []*row) {
	type key struct {
		topic string
		part  int32
		agg   string
	}
	var failed map[key]bool
	for _, r := range rows {
		k := key{r.d.Topic, r.d.Partition, r.e.AggregateID}
		switch {
		case r.err != nil:
			if failed == nil {
				failed = map[key]bool{}
			}
			failed[k] = true
		case failed[k]:
			p.cfg.Hooks.OrderBreak()
			p.log.Error("an event was acknowledged after an earlier event of its aggregate failed on its partition: consumers may see this aggregate's events out of order",
				"id", textcut.ID(r.e.ID), "aggregate_id", textcut.ID(r.e.AggregateID), "topic", r.d.Topic, "partition", r.d.Partition)
		}
	}
}

// sortRows puts rows in insert order: created_at, then the id (as a
// number when both are numbers).
func sortRows(rows []*row) {
	slices.SortStableFunc(rows, func(a, b *row) int {
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		x, errX := strconv.ParseInt(a.id, 10, 64)
		y, errY := strconv.ParseInt(b.id, 10, 64)
		if errX == nil && errY == nil {
			return cmp.Compare(x, y)
		}
		return cmp.Compare(a.id, b.id)
	})
}
