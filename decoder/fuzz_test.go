package decoder

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/event"
)

// FuzzDecode feeds arbitrary bytes to a decoder that knows the outbox
// relation and is inside a transaction: it must never panic (only the
// library parser is recovered, so a panic of the decoder's own code fails
// the target), every error must be an *Error, and the hand-written insert
// parser must agree with pglogrepl's on every insert it accepts.
func FuzzDecode(f *testing.F) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, seed := range [][]byte{
		beginMsg(0x10, at, 1),
		commitMsg(0x10, 0x20, at),
		relationMsg(1, "public", "outbox", outboxCols),
		insertMsg(1, s(testID), s("order"), s("a"), s("T"), s("{}"), s("1"), s("1.5"), s("2026-01-01 00:00:00+00"), s("t")),
		insertMsg(1, s(testID), nil, nil, nil, nil, nil, nil, nil, nil),
		logicalMsg(true, 0x11, "walrelay", `{"id":"x","aggregatetype":"a","aggregateid":"b","payload":{}}`),
		logicalMsg(false, 0x11, "walrelay.heartbeat", ``),
		{'U', 0, 0, 0, 1, 'N', 0, 1, 'n'},
		{'T', 0, 0, 0, 1, 0, 0, 0, 0, 1},
		{},
	} {
		f.Add(seed)
	}
	// Real messages captured from PostgreSQL by TestGolden.
	if b, err := os.ReadFile("testdata/stream.hex"); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			_, data := parseHexLine(f, line)
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := New(Config{Layout: Layout{HeaderColumns: []string{"tenant", "amount", "created_at", "urgent"}}, Messages: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decode(1, relationMsg(1, "public", "outbox", outboxCols)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decode(2, beginMsg(0x10, at, 1)); err != nil {
			t.Fatal(err)
		}
		for range 2 { // twice: a relation message may be followed by its use
			m, err := d.Decode(3, data)
			var de *Error
			if err != nil && !errors.As(err, &de) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			if err == nil && m == nil {
				t.Fatal("nil message without an error")
			}
		}
		if len(data) > 0 && data[0] == 'I' {
			sameInsert(t, data)
		}
		// The same bytes as what the replication stream kept of a message
		// too large to hold, a value of it left out.
		if len(data) > 0 {
			cut := Cut{Column: int(data[len(data)-1]) % 12, Size: 1 << 30}
			m, err := d.DecodeTooLarge(4, TooLarge{Head: data, Size: 1<<30 + 100, Limit: 1 << 20, Cuts: []Cut{cut}})
			var de *Error
			if err != nil && !errors.As(err, &de) {
				t.Fatalf("too large: error of type %T: %v", err, err)
			}
			if em, ok := m.(EventMessage); ok && (em.Payload != nil || !errors.Is(em.Invalid, event.ErrTooLarge)) {
				t.Fatalf("too large: an event with %d payload bytes, invalid %v", len(em.Payload), em.Invalid)
			}
		}
	})
}

// sameInsert checks parseInsert against pglogrepl's parser: what the first
// accepts, the second must read the same (it may accept more: it ignores
// bytes after the tuple and trusts lengths, and panics where they lie;
// it refuses a tuple of no columns).
func sameInsert(t *testing.T, data []byte) {
	rel, vals, err := parseInsert(data, nil)
	if err != nil || len(vals) == 0 {
		return // pglogrepl refuses a tuple of no columns, which a table of none has
	}
	m, err := parse(data)
	if err != nil {
		t.Fatalf("parseInsert accepted an insert pglogrepl refuses: %v", err)
	}
	ins, ok := m.(*pglogrepl.InsertMessage)
	if !ok || ins.RelationID != rel || ins.Tuple == nil || len(ins.Tuple.Columns) != len(vals) {
		t.Fatalf("pglogrepl read %#v; parseInsert relation %d, %d columns", m, rel, len(vals))
	}
	for i, c := range ins.Tuple.Columns {
		if c.DataType != vals[i].kind || !bytes.Equal(c.Data, vals[i].data) {
			t.Fatalf("column %d: pglogrepl %q %q, parseInsert %q %q", i, c.DataType, c.Data, vals[i].kind, vals[i].data)
		}
	}
}
