package decoder

import (
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/event"
)

// TestVersionColumn: the version column becomes the
// walrelay.aggregate_version header in decimal, whatever the integer
// type; a NULL version makes the event invalid (dead-lettered, never
// published without it); a column of another type, or missing, stops the
// stream at its Relation; the RowReader of the tools and the poll source
// reads it alike.
func TestVersionColumn(t *testing.T) {
	t.Parallel()
	cols := func(oid uint32) []col {
		return []col{{Name: "id", OID: oidUUID}, {Name: "aggregatetype", OID: oidVarchar}, {Name: "aggregateid", OID: oidVarchar},
			{Name: "type", OID: oidVarchar}, {Name: "payload", OID: oidJSONB}, {Name: "v", OID: oid}}
	}
	for _, c := range []struct {
		name    string
		oid     uint32
		value   *string
		header  string
		invalid string
	}{
		{"bigint", oidInt8, s("9007199254740993"), "9007199254740993", ""},
		{"integer", oidInt4, s("7"), "7", ""},
		{"smallint, negative", oidInt2, s("-2"), "-2", ""},
		{"null", oidInt8, nil, "", "aggregate's version (outbox.version_column) is required"},
		{"not a number", oidInt8, s("seven"), "", "column v"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d, err := New(Config{Layout: Layout{VersionColumn: "v"}})
			if err != nil {
				t.Fatal(err)
			}
			mustDecode(t, d, relationMsg(16384, "public", "outbox", cols(c.oid)))
			mustDecode(t, d, beginMsg(0x5000, time.Now(), 1))
			e := mustDecode(t, d, insertMsg(16384, s(testID), s("order"), s("o-1"), s("T"), s("{}"), c.value)).(EventMessage)
			got, n := "", 0
			for _, h := range e.Headers {
				if h.Key == event.HeaderAggregateVersion {
					got, n = string(h.Value), n+1
				}
			}
			if got != c.header || n != min(len(c.header), 1) {
				t.Fatalf("header %q (%d of them), want %q", got, n, c.header)
			}
			if (e.Invalid == nil) != (c.invalid == "") || e.Invalid != nil && !strings.Contains(e.Invalid.Error(), c.invalid) {
				t.Fatalf("invalid %v, want %q", e.Invalid, c.invalid)
			}
			rr, err := NewRowReader(Layout{VersionColumn: "v"}, []Column{{"id", oidUUID}, {"aggregatetype", oidVarchar},
				{"aggregateid", oidVarchar}, {"type", oidVarchar}, {"payload", oidJSONB}, {"v", c.oid}})
			if err != nil {
				t.Fatal(err)
			}
			var v []byte
			if c.value != nil {
				v = []byte(*c.value)
			}
			re, err := rr.Event([][]byte{[]byte(testID), []byte("order"), []byte("o-1"), []byte("T"), []byte("{}"), v})
			if err != nil {
				t.Fatal(err)
			}
			if len(re.Headers) != len(e.Headers) || (re.Invalid == nil) != (e.Invalid == nil) {
				t.Fatalf("the row reader made headers %v, invalid %v; the WAL %v, %v", re.Headers, re.Invalid, e.Headers, e.Invalid)
			}
		})
	}
	for _, c := range []struct {
		name string
		cols []col
	}{
		{"text", cols(oidText)}, {"numeric", cols(oidNumeric)}, {"missing", cols(oidInt8)[:5]},
	} {
		d, err := New(Config{Layout: Layout{VersionColumn: "v"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decode(0x100, relationMsg(16384, "public", "outbox", c.cols)); err == nil || !strings.Contains(err.Error(), `"v"`) {
			t.Fatalf("%s: the Relation gave %v", c.name, err)
		}
	}
	if err := (Layout{VersionColumn: "a\nb"}).CheckNames(); err == nil || !strings.Contains(err.Error(), "version column") {
		t.Fatalf("a version column with a newline: %v", err)
	}
}
