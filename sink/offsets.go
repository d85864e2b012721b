package sink

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/failure"
)

// The offsets topic of exactly-once mode: its creation and shape, the
// checks of the brokers, and the reading of the committed position.

// positionRecord is the value of a position on the offsets topic.
type positionRecord struct {
	Slot            string `json:"slot"`
	Source          string `json:"source,omitempty"`
	CommitLSN       string `json:"commit_lsn"`
	Index           int    `json:"index"`
	Timeline        int32  `json:"timeline,omitempty"`
	TransactionalID string `json:"transactional_id"`
	CommittedAt     string `json:"committed_at"`
}

// offsetsWindow is the number of offsets readCommitted reads back from
// the marker first; each further window reaches four times as far back,
// so a position n offsets back costs about 4n/3 records read at most,
// however long the topic is.
const offsetsWindow = 256

// readCommitted reads the committed position of Key: it commits a marker
// of its own to the offsets topic, then reads the topic with read_committed
// isolation back from the marker, in windows that grow fourfold, until a
// window holds a position of Key or the topic's start is reached. Every
// position committed before the marker is below it, so the latest one of
// Key is the position. It runs with nothing else produced meanwhile.
func (s *Sink) readCommitted(ctx context.Context) error {
	t := s.tx
	t.mu.Lock()
	ownAt := t.ownAt // before the marker: records past it are another instance's (sameSlot)
	t.mu.Unlock()
	markerAt, err := s.writeMarker(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.firstMarker < 0 {
		t.firstMarker = markerAt
	}
	t.mu.Unlock()
	var last *kgo.Record // the latest position record of Key below the marker
	var read int64       // records read
	other := false       // a record of Key that another instance wrote (sameSlot)
	for to, w := markerAt, int64(offsetsWindow); ; w *= 4 {
		from := max(0, to-w)
		r, n, o, err := s.readOffsets(ctx, from, to, ownAt)
		read += n
		other = other || o
		if err != nil {
			return err
		}
		if r != nil || from == 0 {
			last = r
			break
		}
		to = from
	}
	var pos event.Position
	var pr positionRecord
	foreign := false // a position of another system identifier, taken over
	if last != nil {
		var lsn pglogrepl.LSN
		err := json.Unmarshal(last.Value, &pr)
		if err == nil {
			lsn, err = pglogrepl.ParseLSN(pr.CommitLSN)
		}
		if err != nil {
			return failure.Mark(failure.Fatal, fmt.Errorf("the position record of %s at offset %d of %s: %w", t.cfg.Key, last.Offset, t.cfg.OffsetsTopic, err))
		}
		if pr.Source != "" && t.cfg.Source != "" && pr.Source != t.cfg.Source {
			if pr.TransactionalID == "" || pr.TransactionalID != t.cfg.Takeover {
				return failure.Mark(failure.Fatal, fmt.Errorf("the offsets topic %s holds a position of slot %s on another database (%s, not %s), committed under transactional id %s: "+
					"give this relay its own slot name or offsets topic; or, if it is this database under a new system identifier (after a pg_upgrade, which carried the slot over: docs/upgrading.md), "+
					"set kafka.transactional_id_takeover: %s to fence it and take its position over",
					t.cfg.OffsetsTopic, pr.Slot, pr.Source, t.cfg.Source, pr.TransactionalID, pr.TransactionalID))
			}
			// The takeover of a position of another system identifier
			// (pg_upgrade): its timeline is of the old cluster's history,
			// not of this one's; the check against this server's flushed
			// WAL still holds (checkHistory).
			foreign = true
		}
		pos = event.Position{CommitLSN: lsn, Index: pr.Index}
	}
	writer := pr.TransactionalID
	if writer != "" && writer != t.cfg.ID && writer != t.cfg.Takeover {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position of slot %s on %s (%s) was committed under transactional id %s, and this relay's is %s; "+
			"instances of different transactional ids do not fence each other, so both could commit: give every instance of the slot the same kafka.transactional_id (empty: the default), "+
			"or, after a change of the id, set kafka.transactional_id_takeover: %s to fence it and take over",
			ErrOtherTransactionalID, t.cfg.Key, t.cfg.OffsetsTopic, pos, writer, t.cfg.ID, writer))
	}
	onTL := pr.Timeline
	if foreign {
		onTL = 0
	}
	t.mu.Lock()
	if other && t.pending > 0 {
		// Another instance of this slot wrote to the offsets topic since
		// this sink's last record: it held the slot (a standby, a rolling
		// restart), and its initialisation of the id is what fenced this
		// sink. The renewals since are explained.
		t.unexplained = t.unexplained[:len(t.unexplained)-min(t.pending, len(t.unexplained))]
	}
	t.pending = 0
	t.committed, t.writer, t.onTL, t.readLast = pos, writer, onTL, read
	logForeign := foreign && t.foreign != pr.Source
	if logForeign {
		t.foreign = pr.Source
	}
	t.mu.Unlock()
	s.log.Info("exactly-once: the committed position read", "transactional_id", t.cfg.ID, "position", pos.String(), "found", last != nil, "committed_by", writer,
		"marker_offset", markerAt, "records_read", read)
	if logForeign {
		s.log.Warn("exactly-once: the committed position is of another system identifier (kafka.transactional_id_takeover names its writer): taken over; it must lie below this server's WAL",
			"committed_on", pr.Source, "database", t.cfg.Source, "position", pos.String())
	}
	return nil
}

// A marker's key is Key with markerSuffix; its header markerIDHeader
// names the transactional id that committed it (sharedBy), and
// markerSourceHeader the database (Source) of the relay (sameSlot).
const (
	markerSuffix       = "#marker"
	markerIDHeader     = "transactional_id"
	markerSourceHeader = "source"
)

// writeMarker commits a record of its own to the offsets topic, keyed
// Key#marker, in a transaction of the transactional producer, and returns
// its offset.
func (s *Sink) writeMarker(ctx context.Context) (int64, error) {
	t := s.tx
	nonce := make([]byte, 8)
	rand.Read(nonce)
	wctx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	defer cancel()
	// An earlier attempt that the broker cut may have left a transaction
	// open in the client (nothing of it can commit): end it first.
	if err := s.client().EndTransaction(wctx, kgo.TryAbort); err != nil {
		t.endAnswered(false, err)
		if fenced(err) {
			return 0, failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, t.cfg.ID, err))
		}
		return 0, fmt.Errorf("abort the kafka transaction: %w", err)
	}
	if err := s.client().BeginTransaction(); err != nil {
		if fenced(err) { // the client's producer id failed so: it can begin nothing more
			return 0, failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: begin a kafka transaction: %w", ErrFenced, t.cfg.ID, err))
		}
		return 0, fmt.Errorf("begin a kafka transaction: %w", err)
	}
	// The client flushes manually (package produce): produce, then flush. The
	// callback may run after a Flush cut by wctx: it answers on a channel.
	type answer struct {
		at  int64
		err error
	}
	answered := make(chan answer, 1)
	marker := &kgo.Record{Topic: t.cfg.OffsetsTopic, Partition: 0, Key: []byte(t.cfg.Key + markerSuffix), Value: []byte(hex.EncodeToString(nonce)),
		Headers: []kgo.RecordHeader{{Key: markerIDHeader, Value: []byte(t.cfg.ID)}, {Key: markerSourceHeader, Value: []byte(t.cfg.Source)}}}
	s.client().Produce(wctx, marker,
		func(r *kgo.Record, perr error) { answered <- answer{r.Offset, perr} })
	var at int64
	err := s.client().Flush(wctx)
	if err == nil { // every record answered
		a := <-answered
		at, err = a.at, a.err
		if err == nil {
			t.wrote(at) // its own, even if its transaction does not commit (sameSlot)
		}
	}
	try := kgo.TryCommit
	if err != nil {
		try = kgo.TryAbort
	}
	endErr := s.client().EndTransaction(wctx, try)
	t.endAnswered(try == kgo.TryCommit, endErr)
	if err == nil {
		err = endErr
	}
	if err != nil {
		if fenced(err) {
			return 0, failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, t.cfg.ID, err))
		}
		return 0, fmt.Errorf("write a marker to the offsets topic %s: %w", t.cfg.OffsetsTopic, err)
	}
	return at, nil
}

// readOffsets reads the offsets topic from offset from with read_committed
// isolation until a record at offset to or past it (the marker is one),
// and returns the latest position record of Key below to, if any, the
// number of records read, and whether it read a record of Key that
// another instance wrote past ownAt (sameSlot).
func (s *Sink) readOffsets(ctx context.Context, from, to, ownAt int64) (last *kgo.Record, n int64, other bool, err error) {
	t := s.tx
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID(s.cfg.ClientID + "-offsets"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.cfg.OffsetsTopic: {0: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, s.clientOpts()...)...)
	if err != nil {
		return nil, 0, false, fmt.Errorf("create the offsets reader: %w", err)
	}
	defer cl.Close()
	var shared error // a position of another slot under this transactional id (sharedBy)
	read := from - 1 // the last offset read
	for {
		rctx, cancel := context.WithTimeout(ctx, readIdleTimeout)
		fs := cl.PollFetches(rctx)
		idle := rctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, n, false, fmt.Errorf("read the offsets topic %s to the marker of this instance: %w", t.cfg.OffsetsTopic, err)
		}
		if idle {
			return nil, n, false, fmt.Errorf("read the offsets topic %s to the marker of this instance: no record in %s after offset %d "+
				"(an open transaction of another instance holds the topic until it ends)", t.cfg.OffsetsTopic, readIdleTimeout, read)
		}
		for _, fe := range fs.Errors() {
			if !kerr.IsRetriable(fe.Err) {
				return nil, n, false, fmt.Errorf("read the offsets topic %s: %w", t.cfg.OffsetsTopic, fe.Err)
			}
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done || r.Offset >= to {
				done = true
				return
			}
			n, read = n+1, r.Offset
			if string(r.Key) == t.cfg.Key {
				last = r
			} else if shared == nil {
				shared = s.sharedBy(r)
			}
			other = other || s.sameSlot(r, ownAt)
		})
		if shared != nil {
			return nil, n, false, shared
		}
		if done {
			return last, n, other, nil
		}
	}
}

// sharedBy returns ErrSharedTransactionalID, fatal, if r is a record of
// another slot than Key (a position, or the marker of a read of one)
// committed under this sink's transactional id after the sink's first
// marker (firstMarker): an instance of another slot that ran while this
// one did uses the same id, and each fences the other. One before it (a
// slot renamed under a kafka.transactional_id kept, its old name's relay
// stopped) is not: the offsets topic's one partition orders them,
// whatever the hosts' clocks say.
func (s *Sink) sharedBy(r *kgo.Record) error {
	t := s.tx
	t.mu.Lock()
	first := t.firstMarker
	t.mu.Unlock()
	if first < 0 || r.Offset <= first {
		return nil
	}
	var slot, what string
	if key, ok := strings.CutSuffix(string(r.Key), markerSuffix); ok {
		for _, h := range r.Headers {
			if h.Key == markerIDHeader && string(h.Value) == t.cfg.ID {
				slot, what = key, "the marker of a read of the committed position"
			}
		}
	} else if bytes.Contains(r.Value, []byte(`"transactional_id":"`+t.cfg.ID+`"`)) {
		var pr positionRecord
		if json.Unmarshal(r.Value, &pr) == nil && pr.TransactionalID == t.cfg.ID {
			slot, what = pr.Slot, "a position committed at "+pr.CommittedAt
		}
	}
	if slot == "" || slot == t.cfg.Key {
		return nil
	}
	return failure.Mark(failure.Fatal, fmt.Errorf("%w: the offsets topic %s holds %s of slot %s under transactional id %s (offset %d), written since this relay, of slot %s, started with the same id: "+
		"set a kafka.transactional_id of its own for each slot (empty: the default, which names the slot)",
		ErrSharedTransactionalID, t.cfg.OffsetsTopic, what, slot, t.cfg.ID, r.Offset, t.cfg.Key))
}

// sameSlot reports whether r is a record of this slot (a position of Key,
// or a marker of Key's) of this database under this sink's transactional
// id past ownAt, the sink's latest record: another instance of the slot
// wrote it, one that held the slot meanwhile. The offsets topic's one
// partition orders them. Before the sink's first record (ownAt -1)
// nothing is. A slot of the same name on another database, given the
// same id and offsets topic, is not this slot: its records name another
// Source (a marker without the source header, of an older walrelay, is
// not counted).
func (s *Sink) sameSlot(r *kgo.Record, ownAt int64) bool {
	t := s.tx
	if ownAt < 0 || r.Offset <= ownAt {
		return false
	}
	switch string(r.Key) {
	case t.cfg.Key + markerSuffix:
		id, source := false, false
		for _, h := range r.Headers {
			switch h.Key {
			case markerIDHeader:
				id = string(h.Value) == t.cfg.ID
			case markerSourceHeader:
				source = string(h.Value) == t.cfg.Source
			}
		}
		return id && source
	case t.cfg.Key:
		var pr positionRecord
		return json.Unmarshal(r.Value, &pr) == nil && pr.TransactionalID == t.cfg.ID && pr.Source == t.cfg.Source
	}
	return false
}
