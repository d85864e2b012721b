package inbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
)

// Version order (Config.VersionOrder). Kafka keeps the records of one key
// in one partition, in order, so an aggregate's events come in version
// order unless one is missing: dead-lettered by the relay and replayed
// later (then it comes after the later ones), or never written. A worker
// therefore checks each record's version against the last one handled of
// its aggregate, kept in the versions table and read and written in the
// batch's transaction: the next is handled, a stale one skipped, and one
// ahead is held in memory (the partition's other records go on) until
// its aggregate's versions catch up with it, which puts it back at the
// head of the queue, or VersionWait passes, which dead-letters it. The
// partition's offset is not committed past a held record (mark), so a
// restart or a rebalance reads it again and nothing held is lost.

// errInvalidVersion is the failure of a record whose version header
// cannot be read: dead-lettered (invalid_version), never handled out of
// order.
var errInvalidVersion = errors.New("the record's " + event.HeaderAggregateVersion + " header cannot be read")

// recordVersion reads r's version header: ok is false without one; the
// error wraps errInvalidVersion for several, or one not a decimal int64.
func recordVersion(r *kgo.Record) (v int64, ok bool, err error) {
	n := 0
	var text []byte
	for _, h := range r.Headers {
		if h.Key == event.HeaderAggregateVersion {
			text, n = h.Value, n+1
		}
	}
	switch {
	case n == 0:
		return 0, false, nil
	case n > 1:
		return 0, false, fmt.Errorf("%w: the record has %d of them", errInvalidVersion, n)
	}
	v, err = strconv.ParseInt(string(text), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %q is not a decimal integer", errInvalidVersion, text)
	}
	return v, true, nil
}

// unreadable is why r cannot be handled (dead-lettered with the reason
// idReason gives), or nil: its event id does not read (eventID), or, with
// VersionOrder, its version.
func (c *Consumer) unreadable(r *kgo.Record) error {
	if _, err := eventID(r); err != nil {
		return err
	}
	if c.cfg.VersionOrder {
		if _, _, err := recordVersion(r); err != nil {
			return err
		}
	}
	return nil
}

// versionVerdict is what a record's version says it is to its aggregate.
type versionVerdict int

const (
	versionNext  versionVerdict = iota // handled, its version kept
	versionNone                        // no version: handled, nothing kept
	versionStale                       // at or below the last handled: skipped
	versionAhead                       // above the next: held
)

// versionCheck is a record's version against its aggregate's.
type versionCheck struct {
	verdict   versionVerdict
	got, want int64 // the record's version, and the next one of its aggregate
}

// aggregateKey is the aggregate of r in the versions table: its key (a
// record without one: the empty key, one aggregate).
func aggregateKey(r *kgo.Record) []byte {
	if r.Key == nil {
		return []byte{}
	}
	return r.Key
}

// checkVersion compares r's version with the last one handled of its
// aggregate, read in tx with its row locked until tx ends.
func (w *worker) checkVersion(ctx context.Context, tx pgx.Tx, r *kgo.Record) (versionCheck, error) {
	c := w.c
	got, ok, _ := recordVersion(r) // readable: unreadable passed it
	if !ok {
		c.m.versionMissing.WithLabelValues(r.Topic).Inc()
		if !w.versionlessLogged {
			w.versionlessLogged = true
			c.log.Warn("a record without the "+event.HeaderAggregateVersion+" header while VersionOrder is on: handled without ordering (set outbox.version_column on the relay); counted in walrelay_inbox_version_missing_total, logged once per partition",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "id", logID(r))
		}
		return versionCheck{verdict: versionNone}, nil
	}
	var last int64
	err := tx.QueryRow(ctx, "SELECT version FROM "+c.versions+" WHERE consumer = $1 AND topic = $2 AND aggregate = $3 FOR UPDATE",
		c.cfg.Consumer, r.Topic, aggregateKey(r)).Scan(&last)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return versionCheck{verdict: versionNext, got: got, want: got}, nil // its first event
	case err != nil:
		return versionCheck{}, fmt.Errorf("read the version of aggregate %q of %s in %s: %w", r.Key, r.Topic, c.versions, err)
	case got <= last:
		return versionCheck{verdict: versionStale, got: got, want: last + 1}, nil
	case last < math.MaxInt64 && got == last+1:
		return versionCheck{verdict: versionNext, got: got, want: got}, nil
	}
	return versionCheck{verdict: versionAhead, got: got, want: last + 1}, nil
}

// storeVersion keeps v as the last version handled of r's aggregate, in
// tx.
func (w *worker) storeVersion(ctx context.Context, tx pgx.Tx, r *kgo.Record, v int64) error {
	c := w.c
	_, err := tx.Exec(ctx, "INSERT INTO "+c.versions+" AS v (consumer, topic, aggregate, version) VALUES ($1, $2, $3, $4)"+
		" ON CONFLICT (consumer, topic, aggregate) DO UPDATE SET version = greatest(v.version, EXCLUDED.version), handled_at = now()",
		c.cfg.Consumer, r.Topic, aggregateKey(r), v)
	if err != nil {
		return fmt.Errorf("keep version %d of aggregate %q of %s in %s: %w", v, r.Key, r.Topic, c.versions, err)
	}
	w.advanced[string(aggregateKey(r))] = true
	return nil
}

// heldRecord is a record whose version is ahead of its aggregate's next.
type heldRecord struct {
	r         *kgo.Record
	got, want int64
	since     time.Time // when it was first held
}

// hold holds h.r, out of the queue (its batch committed), until its aggregate's versions catch up
// (release) or VersionWait passes (expireHeld). A record released and
// held again keeps its first time.
func (w *worker) hold(h heldRecord) {
	r := h.r
	since, ok := w.heldSince[r.Offset]
	if !ok {
		since = time.Now()
	}
	w.mu.Lock()
	i, _ := slices.BinarySearchFunc(w.held, r.Offset, func(h heldRecord, off int64) int { return compareInt(h.r.Offset, off) })
	h.since = since
	w.held = slices.Insert(w.held, i, h)
	n := len(w.held)
	w.mu.Unlock()
	w.c.m.versionWaiting.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(float64(n))
	w.c.log.Debug("a record waits for the versions of its aggregate before its own", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"id", logID(r), "aggregate", string(r.Key), "expected", h.want, "got", h.got)
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// release puts the held records of the aggregates whose version moved in
// the last batch back at the head of the queue, in offset order, to be
// checked again.
func (w *worker) release() {
	if len(w.advanced) == 0 {
		return
	}
	w.mu.Lock()
	var back []*kgo.Record
	w.held = slices.DeleteFunc(w.held, func(h heldRecord) bool {
		if w.advanced[string(aggregateKey(h.r))] {
			back = append(back, h.r)
			w.heldSince[h.r.Offset] = h.since
			return true
		}
		return false
	})
	if len(back) > 0 {
		w.queue = append(back, w.queue...)
	}
	n := len(w.held)
	w.mu.Unlock()
	clear(w.advanced)
	w.c.m.versionWaiting.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(float64(n))
}

// expireHeld dead-letters the held records that waited VersionWait
// (version_gap), and marks them done; it returns early if the worker
// stops meanwhile.
func (w *worker) expireHeld() {
	c := w.c
	for {
		w.mu.Lock()
		var h heldRecord
		i := slices.IndexFunc(w.held, func(h heldRecord) bool { return time.Since(h.since) >= c.cfg.VersionWait })
		if i >= 0 {
			h = w.held[i]
		}
		w.mu.Unlock()
		if i < 0 {
			return
		}
		err := fmt.Errorf("aggregate %q of topic %s: expected version %d, got %d; the versions before it did not arrive within %s (VersionWait)",
			h.r.Key, h.r.Topic, h.want, h.got, c.cfg.VersionWait)
		if !w.sendDeadLetter(h.r, "version_gap", err, 0, h.since) {
			return
		}
		w.mu.Lock()
		w.held = slices.DeleteFunc(w.held, func(x heldRecord) bool { return x.r == h.r })
		n := len(w.held)
		w.mu.Unlock()
		c.m.versionWaiting.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(float64(n))
		w.mark(h.r)
		w.pop(0) // fetching resumes if the partition was paused for the held
	}
}

// nextExpiry is when the first held record has waited VersionWait.
func (w *worker) nextExpiry() (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.held) == 0 {
		return time.Time{}, false
	}
	first := w.held[0].since
	for _, h := range w.held[1:] {
		if h.since.Before(first) {
			first = h.since
		}
	}
	return first.Add(w.c.cfg.VersionWait), true
}

// markable is the record whose offset may be committed once r is done:
// r, or the last done one if later, unless a held record comes before
// it: then the one before the first held (as a record of its offset), so
// that a restart reads the held record again.
func (w *worker) markable(r *kgo.Record) *kgo.Record {
	if w.finished == nil || r.Offset > w.finished.Offset {
		w.finished = r
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.held) > 0 && w.held[0].r.Offset <= w.finished.Offset {
		h := w.held[0].r
		return &kgo.Record{Topic: h.Topic, Partition: h.Partition, LeaderEpoch: h.LeaderEpoch, Offset: h.Offset - 1}
	}
	return w.finished
}

// checkVersions refuses VersionOrder without the versions table.
func (c *Consumer) checkVersions(ctx context.Context) error {
	if !c.cfg.VersionOrder {
		return nil
	}
	var exists bool
	if err := c.cfg.Postgres.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", c.versions).Scan(&exists); err != nil {
		return fmt.Errorf("inbox: look up the versions table %s: %w", c.versions, err)
	}
	if !exists {
		return fmt.Errorf("inbox: VersionOrder keeps each aggregate's version in %s, which does not exist: run walrelay migrate --inbox, or inbox.Migrate (an inbox table whose name is over 54 bytes has none: take a shorter one)", c.versions)
	}
	return nil
}

// dropHeld forgets the held records of a worker that ends: the offset
// was not committed past them, so the partition's next owner reads them
// again.
func (w *worker) dropHeld() {
	w.mu.Lock()
	n := len(w.held)
	w.held = nil
	w.mu.Unlock()
	if n > 0 {
		w.c.m.versionWaiting.WithLabelValues(w.tp.topic, strconv.Itoa(int(w.tp.partition))).Set(0)
	}
}
