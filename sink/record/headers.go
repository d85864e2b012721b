package record

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
)

// txnHeaders are the header values shared by every event of a
// transaction, formatted once for it.
type txnHeaders struct {
	lsn                        pglogrepl.LSN
	xid                        uint32
	commit                     time.Time // events without a position (poll, replay) differ only in it
	lsnText, xidText, timeText []byte
}

// HeaderID is the header of the event id, which every record carries.
const HeaderID = "id"

// OptionalHeaders are the headers a record carries after HeaderID, in
// this order, each unless Config.OmitHeaders names it: the event type, and
// the commit LSN, transaction id and commit time of its transaction.
var OptionalHeaders = [...]string{"type", "walrelay.lsn", "walrelay.xid", HeaderCommitTime}

// HeaderCommitTime is the header of the commit time of an event's
// transaction (one of OptionalHeaders), left out for an event of no known
// time.
const HeaderCommitTime = "walrelay.commit_time"

// omitted reads Config.OmitHeaders: which of OptionalHeaders are left out.
func omitted(names []string) ([len(OptionalHeaders)]bool, error) {
	var omit [len(OptionalHeaders)]bool
	for _, n := range names {
		i := slices.Index(OptionalHeaders[:], n)
		if i < 0 {
			if n == HeaderID {
				return omit, errors.New("headers: the id header is always sent (consumers deduplicate on it)")
			}
			return omit, fmt.Errorf("headers: %q is not a header that can be left out (%s)", n, strings.Join(OptionalHeaders[:], ", "))
		}
		omit[i] = true
	}
	return omit, nil
}

// Headers returns e's record headers: HeaderID, OptionalHeaders but those
// Config.OmitHeaders names, and the configured extra columns; extra leaves
// room for more. The values of the transaction's headers are formatted
// once per transaction (commit LSN, xid and commit time) and shared by its
// records (the client does not modify them), which changes no value.
func (b *Builder) Headers(e *event.Event, extra int) []kgo.RecordHeader {
	b.mu.Lock()
	if t := &b.last; t.lsnText == nil || t.lsn != e.CommitLSN || t.xid != e.Xid || !t.commit.Equal(e.CommitTime) {
		*t = txnHeaders{lsn: e.CommitLSN, xid: e.Xid, commit: e.CommitTime, lsnText: []byte(e.CommitLSN.String()),
			xidText: strconv.AppendUint(nil, uint64(e.Xid), 10), timeText: commitTimeText(e.CommitTime)}
	}
	t := b.last
	b.mu.Unlock()
	h := make([]kgo.RecordHeader, 0, 1+len(OptionalHeaders)+len(e.Headers)+extra)
	h = append(h, kgo.RecordHeader{Key: HeaderID, Value: readOnly(e.ID)})
	for i, v := range [len(OptionalHeaders)][]byte{readOnly(e.Type), t.lsnText, t.xidText, t.timeText} {
		if !b.omit[i] && (v != nil || OptionalHeaders[i] != HeaderCommitTime) {
			h = append(h, kgo.RecordHeader{Key: OptionalHeaders[i], Value: v})
		}
	}
	for _, x := range e.Headers {
		h = append(h, kgo.RecordHeader{Key: x.Key, Value: x.Value})
	}
	return h
}

// commitTimeText is the value of the header walrelay.commit_time, nil for
// an event of no known time (a replayed row without a time column, a poll
// row of unknown time), which then carries no such header.
func commitTimeText(t time.Time) []byte {
	if t.IsZero() {
		return nil
	}
	return t.AppendFormat(nil, time.RFC3339Nano)
}

// ceHeaders is how many headers cloudEventHeaders appends, at most.
const ceHeaders = 7

// cloudEventHeaders appends the CloudEvents binary-mode headers of e to h,
// the headers that Headers made.
func (b *Builder) cloudEventHeaders(h []kgo.RecordHeader, e *event.Event) []kgo.RecordHeader {
	h = append(h,
		kgo.RecordHeader{Key: "ce_specversion", Value: []byte("1.0")},
		kgo.RecordHeader{Key: "ce_id", Value: readOnly(e.ID)},
		kgo.RecordHeader{Key: "ce_source", Value: b.ceSource(e)},
		kgo.RecordHeader{Key: "ce_type", Value: readOnly(e.Type)},
		kgo.RecordHeader{Key: "ce_subject", Value: readOnly(e.AggregateID)},
		kgo.RecordHeader{Key: "content-type", Value: []byte(contentType(e))},
	)
	switch {
	case !e.Time.IsZero():
		h = append(h, kgo.RecordHeader{Key: "ce_time", Value: e.Time.UTC().AppendFormat(nil, time.RFC3339Nano)})
	case !e.CommitTime.IsZero(): // a replayed row without a timestamp column has no time
		// The transaction's walrelay.commit_time, formatted once for it,
		// unless that header is left out.
		var v []byte
		for _, x := range h[:min(len(h), 1+len(OptionalHeaders))] {
			if x.Key == HeaderCommitTime {
				v = x.Value
			}
		}
		if v == nil {
			v = e.CommitTime.AppendFormat(nil, time.RFC3339Nano)
		}
		h = append(h, kgo.RecordHeader{Key: "ce_time", Value: v})
	}
	return h
}

// contentType is the CloudEvents datacontenttype of e's value: a bytea
// payload is bytes of no known type; json, jsonb and text payloads are
// taken as JSON (text is how JSON is often stored).
func contentType(e *event.Event) string {
	if e.PayloadBytes {
		return "application/octet-stream"
	}
	return "application/json"
}

// readOnly returns the bytes of s without copying them. The client only
// reads a record's key and header values (it encodes them into a request),
// and nothing else holds the slice, so the string's immutability is kept;
// it saves three allocations per event.
func readOnly(s string) []byte {
	if s == "" {
		return []byte{} // empty, not null: Kafka tells a null key from an empty one
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// ceSource is the ce_source of e: CloudEventsSource with {table} replaced.
func (b *Builder) ceSource(e *event.Event) []byte {
	if b.ceTable < 0 {
		return readOnly(b.cfg.CloudEventsSource)
	}
	src := b.cfg.CloudEventsSource
	return []byte(src[:b.ceTable] + e.Source + src[b.ceTable+len("{table}"):])
}

// RawKey is e's key as stored, the aggregate id, not copied: the key of a
// record in FormatRaw, and of every dead letter.
func RawKey(e *event.Event) []byte { return readOnly(e.AggregateID) }
