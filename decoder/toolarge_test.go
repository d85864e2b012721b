package decoder

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/event"
)

// TestDecodeTooLarge decodes what the replication stream kept of messages
// too large to hold: an outbox insert or a message under the read prefix
// becomes an event dead-lettered as too large, without its payload, with
// its size and what identifies it that was kept; an update is ignored; any
// other message stops the stream naming the setting to raise.
func TestDecodeTooLarge(t *testing.T) {
	t.Parallel()
	const size, limit = 150_000_123, 3_000_000
	cases := []struct {
		name string
		m    TooLarge
		// want: the event's id, aggregate id and type, the payload size
		// omitted, and what its error says; or the *Error's text.
		id, aggID, typ string
		omitted        int64
		says           []string
		err            string
		ignored        string
	}{
		{
			name: "an insert whose payload was left out",
			m:    TooLarge{Head: insertMsg(16384, s(testID), s("order"), s("a-1"), s("Big"), nil, s("7"), nil, nil, nil), Cuts: []Cut{{Column: 4, Size: 150_000_000}}},
			id:   testID, aggID: "a-1", typ: "Big", omitted: 150_000_000,
			says: []string{"the insert into public.outbox of 150000123 bytes is over postgres.max_message_bytes (3000000)", "column payload (150000000 bytes)"},
		},
		{
			name:  "an insert whose id and payload were left out",
			m:     TooLarge{Head: insertMsg(16384, nil, s("order"), s("a-2"), s("Big"), nil, nil, nil, nil, nil), Cuts: []Cut{{Column: 0, Size: 100_000}, {Column: 4, Size: 150_000_000}}},
			aggID: "a-2", typ: "Big", omitted: 150_000_000,
			says: []string{"column id (100000 bytes), column payload (150000000 bytes)"},
		},
		{
			name: "an insert whose header column was left out: the payload is not published either",
			m:    TooLarge{Head: insertMsg(16384, s(testID), s("order"), s("a-3"), s("Big"), s(`{"x":1}`), nil, nil, nil, nil), Cuts: []Cut{{Column: 6, Size: 150_000_000}}},
			id:   testID, aggID: "a-3", typ: "Big", omitted: 7,
			says: []string{"column amount (150000000 bytes)"},
		},
		{
			name: "a message under the read prefix, its content cut",
			m:    TooLarge{Head: logicalMsg(true, 0x11, "walrelay", `{"id":"m-1","aggregatetype":"order","meta":{"a":[1,{"b":2}]},"aggregateid":"a-4","type":"Big","payload":{"pad":"xxxx`), Cuts: []Cut{{Column: 0, Size: 150_000_100}}},
			id:   "m-1", aggID: "a-4", typ: "Big", omitted: 150_000_100,
			says: []string{"the message of 150000123 bytes", "its content (150000100 bytes)"},
		},
		{
			name:    "a heartbeat",
			m:       TooLarge{Head: logicalMsg(false, 0x11, "walrelay.heartbeat", `xx`), Cuts: []Cut{{Column: 0, Size: 150_000_100}}},
			ignored: "heartbeat",
		},
		{
			name:    "an update",
			m:       TooLarge{Head: []byte{'U', 0, 0, 0x40, 0}},
			ignored: "update",
		},
		{
			name: "a relation message",
			m:    TooLarge{Head: relationMsg(16385, "public", "wide", outboxCols)[:100]},
			err:  "a message of 150000123 bytes, over postgres.max_message_bytes (3000000): raise it to read this message",
		},
		{
			name: "an insert into a relation never described",
			m:    TooLarge{Head: insertMsg(99, nil), Cuts: []Cut{{Column: 0, Size: 150_000_000}}},
			err:  "insert into relation 99 before its Relation message",
		},
		{
			name: "a cut outside the tuple",
			m:    TooLarge{Head: insertMsg(16384, s(testID), s("order"), s("a-1"), s("Big"), nil, nil, nil, nil, nil), Cuts: []Cut{{Column: 9, Size: 1}}},
			err:  "column 9 of a tuple of 9",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDecoder(t)
			mustDecode(t, d, relationMsg(16384, "public", "outbox", outboxCols))
			mustDecode(t, d, beginMsg(0x5000, time.Now(), 7))
			tc.m.Size, tc.m.Limit = size, limit
			msg, err := d.DecodeTooLarge(0x4000, tc.m)
			var de *Error
			switch {
			case tc.err != "":
				if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an *Error: %s", msg, err, tc.err)
				}
				return
			case err != nil:
				t.Fatal(err)
			case tc.ignored != "":
				if ig, ok := msg.(Ignored); !ok || ig.Kind != tc.ignored {
					t.Fatalf("got %#v, want Ignored %s", msg, tc.ignored)
				}
				return
			}
			e := msg.(EventMessage).Event
			if e.ID != tc.id || e.AggregateID != tc.aggID || e.Type != tc.typ || e.Payload != nil || e.OmittedBytes != tc.omitted || e.WALStart != 0x4000 || e.CommitLSN != 0x5000 {
				t.Fatalf("event id %q aggregate %q type %q payload %q omitted %d at %s in %s", e.ID, e.AggregateID, e.Type, e.Payload, e.OmittedBytes, e.WALStart, e.CommitLSN)
			}
			if !errors.Is(e.Invalid, event.ErrTooLarge) {
				t.Fatalf("invalid: %v, want event.ErrTooLarge", e.Invalid)
			}
			for _, s := range tc.says {
				if !strings.Contains(e.Invalid.Error(), s) {
					t.Fatalf("invalid: %v, want it to say %q", e.Invalid, s)
				}
			}
		})
	}
}
