package decoder

import (
	"strings"
	"testing"
	"time"
)

// TestTraceContextShapeAndSize: a trace column's text becomes headers only
// in W3C Trace Context's shape and within its sizes, whatever the writer
// put in the row. A traceparent of version 00 is exactly 55 characters; one
// of a later version (not ff) is read by its first 55, which must be
// followed by nothing or '-', and is passed on in the form of version 00,
// anything after them dropped (a 200 KB tail with CR included). A
// tracestate is at most 32 members key=value, keys and values of W3C's
// characters and sizes, unique keys, at most 512 bytes once written
// without the blanks and empty members W3C allows between them; any other
// is dropped (no header), the traceparent kept.
// Before, the 200 KB tail and a tracestate holding CR LF reached Kafka's
// headers as written.
func TestTraceContextShapeAndSize(t *testing.T) {
	t.Parallel()
	const (
		tid    = "0af7651916cd43dd8448eb211c80319c"
		pid    = "b7ad6b7169203331"
		parent = "00-" + tid + "-" + pid + "-01"
	)
	props := func(parent, state string) string {
		return "traceparent=" + parent + "\ntracestate=" + state + "\n"
	}
	member := func(i int) string {
		return "k" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "=v"
	}
	members := func(n int) string {
		var m []string
		for i := range n {
			m = append(m, member(i))
		}
		return strings.Join(m, ",")
	}
	long := "a=" + strings.Repeat("v", 255) + ",b=" + strings.Repeat("v", 255) // 516 bytes
	for _, c := range []struct {
		name, value, parent, state string
	}{
		{"version 00", parent, parent, ""},
		{"version 01 with a 200 KB tail holding CR", "01-" + tid + "-" + pid + "-01-" + strings.Repeat("x\r", 100_000), parent, ""},
		{"version 01, 55 characters", "01-" + tid + "-" + pid + "-03", "00-" + tid + "-" + pid + "-03", ""},
		{"version 01 with a field after", "01-" + tid + "-" + pid + "-01-future", parent, ""},
		{"version 01, no '-' after the flags", "01-" + tid + "-" + pid + "-01x", "", ""},
		{"version 00 with a field after", parent + "-extra", "", ""},
		{"version ff", "ff-" + tid + "-" + pid + "-01", "", ""},
		{"upper-case hex", "00-" + strings.ToUpper(tid) + "-" + pid + "-01", "", ""},
		{"short", parent[:54], "", ""},
		{"in Properties, version 01 with a CR LF tail", props("01-"+tid+"-"+pid+"-01-\\r\\nX-Injected: 1", "rojo\\=1"), parent, "rojo=1"},
		{"tracestate with CR LF", props(parent, "rojo\\=1\\r\\nX-Injected: 1"), parent, ""},
		{"tracestate with a CR", props(parent, "rojo\\=1\rX-Injected: 1"), parent, ""},
		{"tracestate with a tab inside a value", props(parent, "rojo\\=a\tb"), parent, ""},
		{"tracestate, blanks and empty members", props(parent, "rojo\\=1 ,\\t, congo\\=t61rcWkgMzE,"), parent, "rojo=1,congo=t61rcWkgMzE"},
		{"tracestate, multi-tenant key", props(parent, "t-1@sys\\=x,a*b/c_d-e\\=y"), parent, "t-1@sys=x,a*b/c_d-e=y"},
		{"tracestate, 32 members", props(parent, members(32)), parent, members(32)},
		{"tracestate, 33 members", props(parent, members(33)), parent, ""},
		{"tracestate over 512 bytes", props(parent, strings.ReplaceAll(long, "=", "\\=")), parent, ""},
		{"tracestate, an upper-case key", props(parent, "Rojo\\=1"), parent, ""},
		{"tracestate, blanks after a value (W3C's OWS)", props(parent, "rojo\\=1 x \\u0020"), parent, "rojo=1 x"},
		{"tracestate, a value with '='", props(parent, "rojo\\=1\\=2"), parent, ""},
		{"tracestate, a key twice", props(parent, "rojo\\=1,rojo\\=2"), parent, ""},
		{"tracestate, a member without '='", props(parent, "rojo"), parent, ""},
		{"tracestate, a value of 257 characters", props(parent, "a\\="+strings.Repeat("v", 257)), parent, ""},
		{"tracestate, not ASCII", props(parent, "rojo\\=é"), parent, ""},
	} {
		gotParent, gotState := traceContext([]byte(c.value))
		if gotParent != c.parent || gotState != c.state {
			t.Errorf("%s: traceparent %.80q (%d bytes), tracestate %.80q (%d bytes); want %q, %q", c.name, gotParent, len(gotParent), gotState, len(gotState), c.parent, c.state)
		}
	}
}

// TestTraceColumnTailNotPublished: a row whose trace column holds a
// version-01 traceparent with a 200 KB tail holding CR gives the event
// (whose headers the sink publishes as they are) the traceparent of 55
// characters, in the form of version 00, and no more.
func TestTraceColumnTailNotPublished(t *testing.T) {
	t.Parallel()
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cols := []col{{Name: "id", OID: oidUUID}, {Name: "aggregatetype", OID: oidVarchar}, {Name: "aggregateid", OID: oidVarchar},
		{Name: "type", OID: oidVarchar}, {Name: "payload", OID: oidJSONB}, {Name: "trace", OID: oidText}}
	d, err := New(Config{Layout: Layout{TraceColumn: "trace"}})
	if err != nil {
		t.Fatal(err)
	}
	mustDecode(t, d, relationMsg(16384, "public", "outbox", cols))
	mustDecode(t, d, beginMsg(0x5000, time.Now(), 1))
	value := "01" + parent[2:] + "-" + strings.Repeat("x\r", 100_000)
	e := mustDecode(t, d, insertMsg(16384, s(testID), s("order"), s("o-1"), s("T"), s("{}"), &value)).(EventMessage)
	size := 0
	for _, h := range e.Headers {
		size += len(h.Key) + len(h.Value)
	}
	if e.Invalid != nil || len(e.Headers) != 1 || e.Headers[0].Key != "traceparent" || string(e.Headers[0].Value) != parent {
		t.Fatalf("headers of %d bytes in all (first: %.80q), invalid %v; want traceparent %s alone", size, e.Headers[0].Value, e.Invalid, parent)
	}
}
