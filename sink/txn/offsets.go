package txn

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

// ReadCommitted reads the committed position again (readCommitted), as
// Resume does and as the end of a commit of unknown outcome does. Nothing
// may be produced meanwhile.
func (p *Producer) ReadCommitted(ctx context.Context) error { return p.readCommitted(ctx) }

// readCommitted reads the committed position of Key: it commits a marker
// of its own to the offsets topic, then reads the topic with read_committed
// isolation back from the marker, in windows that grow fourfold, until a
// window holds a position of Key or the topic's start is reached. Every
// position committed before the marker is below it, so the latest one of
// Key is the position. It runs with nothing else produced meanwhile.
func (p *Producer) readCommitted(ctx context.Context) error {
	p.mu.Lock()
	ownAt := p.ownAt // before the marker: records past it are another instance's (sameSlot)
	p.mu.Unlock()
	markerAt, err := p.writeMarker(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.firstMarker < 0 {
		p.firstMarker = markerAt
	}
	p.mu.Unlock()
	var last *kgo.Record // the latest position record of Key below the marker
	var read int64       // records read
	other := false       // a record of Key that another instance wrote (sameSlot)
	for to, w := markerAt, int64(offsetsWindow); ; w *= 4 {
		from := max(0, to-w)
		r, n, o, err := p.readOffsets(ctx, from, to, ownAt)
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
			return failure.Mark(failure.Fatal, fmt.Errorf("the position record of %s at offset %d of %s: %w", p.cfg.Key, last.Offset, p.cfg.OffsetsTopic, err))
		}
		if pr.Source != "" && p.cfg.Source != "" && pr.Source != p.cfg.Source {
			if pr.TransactionalID == "" || pr.TransactionalID != p.cfg.Takeover {
				return failure.Mark(failure.Fatal, fmt.Errorf("the offsets topic %s holds a position of slot %s on another database (%s, not %s), committed under transactional id %s: "+
					"give this relay its own slot name or offsets topic; or, if it is this database under a new system identifier (after a pg_upgrade, which carried the slot over: docs/upgrading.md), "+
					"set kafka.transactional_id_takeover: %s to fence it and take its position over",
					p.cfg.OffsetsTopic, pr.Slot, pr.Source, p.cfg.Source, pr.TransactionalID, pr.TransactionalID))
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
	if writer != "" && writer != p.cfg.ID && writer != p.cfg.Takeover {
		return failure.Mark(failure.Fatal, fmt.Errorf("%w: the position of slot %s on %s (%s) was committed under transactional id %s, and this relay's is %s; "+
			"instances of different transactional ids do not fence each other, so both could commit: give every instance of the slot the same kafka.transactional_id (empty: the default), "+
			"or, after a change of the id, set kafka.transactional_id_takeover: %s to fence it and take over",
			ErrOtherTransactionalID, p.cfg.Key, p.cfg.OffsetsTopic, pos, writer, p.cfg.ID, writer))
	}
	onTL := pr.Timeline
	if foreign {
		onTL = 0
	}
	p.mu.Lock()
	if other && p.pending > 0 {
		// Another instance of this slot wrote to the offsets topic since
		// this sink's last record: it held the slot (a standby, a rolling
		// restart), and its initialisation of the id is what fenced this
		// sink. The renewals since are explained.
		p.unexplained = p.unexplained[:len(p.unexplained)-min(p.pending, len(p.unexplained))]
	}
	p.pending = 0
	p.committed, p.writer, p.onTL, p.readLast = pos, writer, onTL, read
	logForeign := foreign && p.foreign != pr.Source
	if logForeign {
		p.foreign = pr.Source
	}
	p.mu.Unlock()
	p.log.Info("exactly-once: the committed position read", "transactional_id", p.cfg.ID, "position", pos.String(), "found", last != nil, "committed_by", writer,
		"marker_offset", markerAt, "records_read", read)
	if logForeign {
		p.log.Warn("exactly-once: the committed position is of another system identifier (kafka.transactional_id_takeover names its writer): taken over; it must lie below this server's WAL",
			"committed_on", pr.Source, "database", p.cfg.Source, "position", pos.String())
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
func (p *Producer) writeMarker(ctx context.Context) (int64, error) {
	nonce := make([]byte, 8)
	rand.Read(nonce)
	wctx, cancel := context.WithTimeout(ctx, txnStepTimeout)
	defer cancel()
	// An earlier attempt that the broker cut may have left a transaction
	// open in the client (nothing of it can commit): end it first.
	if err := p.Client().EndTransaction(wctx, kgo.TryAbort); err != nil {
		p.endAnswered(false, err)
		if fenced(err) {
			return 0, failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, p.cfg.ID, err))
		}
		return 0, fmt.Errorf("abort the kafka transaction: %w", err)
	}
	if err := p.Client().BeginTransaction(); err != nil {
		if fenced(err) { // the client's producer id failed so: it can begin nothing more
			return 0, failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: begin a kafka transaction: %w", ErrFenced, p.cfg.ID, err))
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
	marker := &kgo.Record{Topic: p.cfg.OffsetsTopic, Partition: 0, Key: []byte(p.cfg.Key + markerSuffix), Value: []byte(hex.EncodeToString(nonce)),
		Headers: []kgo.RecordHeader{{Key: markerIDHeader, Value: []byte(p.cfg.ID)}, {Key: markerSourceHeader, Value: []byte(p.cfg.Source)}}}
	p.Client().Produce(wctx, marker,
		func(r *kgo.Record, perr error) { answered <- answer{r.Offset, perr} })
	var at int64
	err := p.Client().Flush(wctx)
	if err == nil { // every record answered
		a := <-answered
		at, err = a.at, a.err
		if err == nil {
			p.wrote(at) // its own, even if its transaction does not commit (sameSlot)
		}
	}
	try := kgo.TryCommit
	if err != nil {
		try = kgo.TryAbort
	}
	endErr := p.Client().EndTransaction(wctx, try)
	p.endAnswered(try == kgo.TryCommit, endErr)
	if err == nil {
		err = endErr
	}
	if err != nil {
		if fenced(err) {
			return 0, failure.Mark(failure.Fatal, fmt.Errorf("%w: %s: %w", ErrFenced, p.cfg.ID, err))
		}
		return 0, fmt.Errorf("write a marker to the offsets topic %s: %w", p.cfg.OffsetsTopic, err)
	}
	return at, nil
}

// readOffsets reads the offsets topic from offset from with read_committed
// isolation until a record at offset to or past it (the marker is one),
// and returns the latest position record of Key below to, if any, the
// number of records read, and whether it read a record of Key that
// another instance wrote past ownAt (sameSlot).
func (p *Producer) readOffsets(ctx context.Context, from, to, ownAt int64) (last *kgo.Record, n int64, other bool, err error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(p.brokers...),
		kgo.ClientID(p.clientID + "-offsets"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{p.cfg.OffsetsTopic: {0: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, p.side...)...)
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
			return nil, n, false, fmt.Errorf("read the offsets topic %s to the marker of this instance: %w", p.cfg.OffsetsTopic, err)
		}
		if idle {
			return nil, n, false, fmt.Errorf("read the offsets topic %s to the marker of this instance: no record in %s after offset %d "+
				"(an open transaction of another instance holds the topic until it ends)", p.cfg.OffsetsTopic, readIdleTimeout, read)
		}
		for _, fe := range fs.Errors() {
			if !kerr.IsRetriable(fe.Err) {
				return nil, n, false, fmt.Errorf("read the offsets topic %s: %w", p.cfg.OffsetsTopic, fe.Err)
			}
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done || r.Offset >= to {
				done = true
				return
			}
			n, read = n+1, r.Offset
			if string(r.Key) == p.cfg.Key {
				last = r
			} else if shared == nil {
				shared = p.sharedBy(r)
			}
			other = other || p.sameSlot(r, ownAt)
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
func (p *Producer) sharedBy(r *kgo.Record) error {
	p.mu.Lock()
	first := p.firstMarker
	p.mu.Unlock()
	if first < 0 || r.Offset <= first {
		return nil
	}
	var slot, what string
	if key, ok := strings.CutSuffix(string(r.Key), markerSuffix); ok {
		for _, h := range r.Headers {
			if h.Key == markerIDHeader && string(h.Value) == p.cfg.ID {
				slot, what = key, "the marker of a read of the committed position"
			}
		}
	} else if bytes.Contains(r.Value, []byte(`"transactional_id":"`+p.cfg.ID+`"`)) {
		var pr positionRecord
		if json.Unmarshal(r.Value, &pr) == nil && pr.TransactionalID == p.cfg.ID {
			slot, what = pr.Slot, "a position committed at "+pr.CommittedAt
		}
	}
	if slot == "" || slot == p.cfg.Key {
		return nil
	}
	return failure.Mark(failure.Fatal, fmt.Errorf("%w: the offsets topic %s holds %s of slot %s under transactional id %s (offset %d), written since this relay, of slot %s, started with the same id: "+
		"set a kafka.transactional_id of its own for each slot (empty: the default, which names the slot)",
		ErrSharedTransactionalID, p.cfg.OffsetsTopic, what, slot, p.cfg.ID, r.Offset, p.cfg.Key))
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
func (p *Producer) sameSlot(r *kgo.Record, ownAt int64) bool {
	if ownAt < 0 || r.Offset <= ownAt {
		return false
	}
	switch string(r.Key) {
	case p.cfg.Key + markerSuffix:
		id, source := false, false
		for _, h := range r.Headers {
			switch h.Key {
			case markerIDHeader:
				id = string(h.Value) == p.cfg.ID
			case markerSourceHeader:
				source = string(h.Value) == p.cfg.Source
			}
		}
		return id && source
	case p.cfg.Key:
		var pr positionRecord
		return json.Unmarshal(r.Value, &pr) == nil && pr.TransactionalID == p.cfg.ID && pr.Source == p.cfg.Source
	}
	return false
}
