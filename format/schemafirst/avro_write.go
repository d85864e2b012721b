package schemafirst

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
)

// registered_avro writes a payload straight into Avro's binary encoding,
// with a running count of its bytes: building the value hamba/avro would
// write (avroNative) costs a map entry for each of a record's fields, a
// map for each union, some hundred bytes for each byte a null or a
// default writes, so a small payload of empty objects in an array of a
// record of optional fields expanded to hundreds of MiB before its size
// was known. The writer holds the payload's JSON and at most the record
// cap of bytes (with append's slack), whatever the schema.

// avroBlockLength is how many items hamba/avro writes in one block of an
// array or a map (its Config.BlockLength's default): the writer writes the
// same bytes as hamba/avro.
const avroBlockLength = 100

// jsonAvroWriter writes JSON values (as decodeJSON reads them) in an Avro
// schema: the bytes hamba/avro writes of what avroNative converts them
// into, without building that value. Once more than max bytes are in
// buf (0: no bound) it stops, over set.
type jsonAvroWriter struct {
	buf  []byte
	max  int
	over bool
	// defaults are the schema's fields' defaults (avroDefaults); read
	// only once compiled. memo: compiling, a default missing from it is
	// computed and kept.
	defaults map[*avro.Field]*avroDefault
	memo     bool
	// kept is the bytes of the defaults kept (compiling); depth, the
	// defaults written from their JSON being written.
	kept  int
	depth int
	// at is where the value being written is, a JSON pointer's tokens
	// (an array's index: name "" and index), made into the pointer only
	// for a mismatch's field.
	at []pathToken
	// unions are the branches the unions of the value have taken, or why
	// none fits (unionChoice), by union and object or array, kept while
	// alts (the branches being tried that have an alternative after them,
	// around the value being written) is not 0: a union tries its
	// branches in turn, and a record branch that fails late has written a
	// nested union first, which the next branch writes again; without
	// them every level of such unions doubled the work (40 levels of a
	// union of two records, a payload of 660 bytes, did not finish in 5 s;
	// each outbox row of it held the relay). A union met outside any
	// alternative is on the value's one way down: not met again.
	unions map[unionKey]unionChoice
	alts   int
	// dry: a union's kept branch is not written again (its value walked
	// again, each time a union around it is), skipped set instead: the
	// bytes are then not the value's, and a second pass writes them, each
	// union's branch known (compileAvro).
	dry, skipped bool
	// trying counts the unions trying their branches around the value
	// being written: a failure's field is then dropped (a branch's
	// reason is kept), so it is not built (here).
	trying int
	// steps counts the values written (write's calls); past limit (0:
	// none) the writer stops, over and stuck set, stuckAt where.
	steps, limit int
	stuck        bool
	stuckAt      string
}

// pathToken is a token of a JSON pointer: name, or index if name is "".
type pathToken struct {
	name  string
	index int
}

// here is the JSON pointer of where the writer is (RFC 6901), for a
// failure's field: "" while a union tries its branches, which drops the
// fields of their failures (building the pointer at each failure of a
// deep value cost the square of its depth).
func (w *jsonAvroWriter) here() string {
	if w.trying > 0 {
		return ""
	}
	return w.pointer()
}

// pointer is the JSON pointer of where the writer is (RFC 6901).
func (w *jsonAvroWriter) pointer() string {
	var b strings.Builder
	for _, t := range w.at {
		b.WriteByte('/')
		if t.name == "" {
			b.WriteString(strconv.Itoa(t.index))
		} else {
			b.WriteString(pointerToken(t.name))
		}
	}
	return b.String()
}

// in writes v in s at the token t below where the writer is.
func (w *jsonAvroWriter) in(t pathToken, s avro.Schema, v any, avroJSON bool) (field, reason string) {
	w.at = append(w.at, t)
	field, reason = w.write(s, v, avroJSON)
	w.at = w.at[:len(w.at)-1]
	return field, reason
}

// full reports whether the bytes written are over the bound (and sets
// over).
func (w *jsonAvroWriter) full() bool {
	if w.max > 0 && len(w.buf) > w.max {
		w.over = true
	}
	return w.over
}

// room reports whether n more bytes fit the bound (else sets over).
func (w *jsonAvroWriter) room(n int) bool {
	if w.max > 0 && len(w.buf)+n > w.max {
		w.over = true
	}
	return !w.over
}

// long writes a long (zig-zag, variable length).
func (w *jsonAvroWriter) long(n int64) {
	w.buf = binary.AppendUvarint(w.buf, uint64(n<<1)^uint64(n>>63))
}

// bytes writes a string or bytes: its length, then it.
func (w *jsonAvroWriter) bytes(b string) {
	if !w.room(len(b) + binary.MaxVarintLen64) {
		return
	}
	w.long(int64(len(b)))
	w.buf = append(w.buf, b...)
}

// write writes the JSON value v in schema s where the writer is: a
// record's missing fields given their defaults, a union's value in its
// first branch that it fits (or Avro's JSON encoding of a union), a
// logical type's value as its underlying type's (avroLogical), as
// hamba/avro writes them. With avroJSON, v is in Avro's own JSON
// encoding (a field's default): a logical type's value is its
// underlying type's. A value that does not fit returns the field and the reason;
// once over the bound it returns at once, over set (its field and reason
// empty).
func (w *jsonAvroWriter) write(s avro.Schema, v any, avroJSON bool) (field, reason string) {
	w.steps++
	if w.limit > 0 && w.steps > w.limit && !w.over {
		w.over, w.stuck, w.stuckAt = true, true, w.pointer()
	}
	if w.full() {
		return "", ""
	}
	if avroJSON {
		v = defaultLeaf(v)
	}
	want := func() (string, string) {
		return w.here(), fmt.Sprintf("want %s, got %s", avroTypeName(s), jsonType(v))
	}
	if ls, ok := s.(avro.LogicalTypeSchema); ok && ls.Logical() != nil && !avroJSON {
		n, _, r := avroLogical(s, ls.Logical(), v, "")
		if r != "" {
			return w.here(), r
		}
		b, err := avro.Marshal(s, n) // a few bytes: a decimal holds at most its precision's
		if err != nil {
			return w.here(), err.Error()
		}
		if w.room(len(b)) {
			w.buf = append(w.buf, b...)
		}
		return "", ""
	}
	switch s.Type() {
	case avro.Ref:
		return w.write(s.(*avro.RefSchema).Schema(), v, avroJSON)
	case avro.Null:
		if v != nil {
			return want()
		}
		return "", ""
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return want()
		}
		if b {
			w.buf = append(w.buf, 1)
		} else {
			w.buf = append(w.buf, 0)
		}
		return "", ""
	case avro.Int, avro.Long:
		n, ok := v.(json.Number)
		if !ok {
			return want()
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return w.here(), fmt.Sprintf("want %s, got %s", avroTypeName(s), n)
		}
		if s.Type() == avro.Int && int64(int32(i)) != i {
			return w.here(), fmt.Sprintf("%d is out of an int's range", i)
		}
		w.long(i)
		return "", ""
	case avro.Float, avro.Double:
		n, ok := v.(json.Number)
		if !ok {
			return want()
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return w.here(), fmt.Sprintf("%s is out of a %s's range", n, s.Type())
		}
		if s.Type() == avro.Float {
			if math.IsInf(float64(float32(f)), 0) {
				// Beyond a float32's range: Avro's float would be an
				// infinity, which the JSON did not say.
				return w.here(), fmt.Sprintf("%s is out of a float's range", n)
			}
			w.buf = binary.LittleEndian.AppendUint32(w.buf, math.Float32bits(float32(f)))
			return "", ""
		}
		w.buf = binary.LittleEndian.AppendUint64(w.buf, math.Float64bits(f))
		return "", ""
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return want()
		}
		w.bytes(str)
		return "", ""
	case avro.Bytes:
		str, ok := v.(string)
		if !ok {
			return want()
		}
		b, ok := latin1(str)
		if !ok {
			return w.here(), "want bytes (a string of code points up to U+00FF, as Avro's JSON encoding writes them)"
		}
		w.bytes(string(b))
		return "", ""
	case avro.Fixed:
		fs := s.(*avro.FixedSchema)
		str, ok := v.(string)
		if !ok {
			return want()
		}
		b, ok := latin1(str)
		if !ok || len(b) != fs.Size() {
			return w.here(), fmt.Sprintf("want %d bytes of the fixed %s", fs.Size(), fs.FullName())
		}
		if w.room(len(b)) {
			w.buf = append(w.buf, b...)
		}
		return "", ""
	case avro.Enum:
		es := s.(*avro.EnumSchema)
		str, ok := v.(string)
		if !ok {
			return want()
		}
		if i := slices.Index(es.Symbols(), str); i >= 0 {
			w.long(int64(i))
			return "", ""
		}
		return w.here(), fmt.Sprintf("%q is not a symbol of the enum %s (%s)", str, es.FullName(), strings.Join(es.Symbols(), ", "))
	case avro.Array:
		a, ok := v.([]any)
		if !ok {
			return want()
		}
		items := s.(*avro.ArraySchema).Items()
		return w.blocks(len(a), func(i int) (string, string) {
			return w.in(pathToken{index: i}, items, a[i], avroJSON)
		})
	case avro.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return want()
		}
		values := s.(*avro.MapSchema).Values()
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys) // hamba/avro writes a Go map's order; one order, the same every time
		return w.blocks(len(keys), func(i int) (string, string) {
			w.bytes(keys[i])
			return w.in(pathToken{name: keys[i]}, values, m[keys[i]], avroJSON)
		})
	case avro.Record:
		return w.record(s.(*avro.RecordSchema), v, avroJSON)
	case avro.Union:
		return w.union(s.(*avro.UnionSchema), v, avroJSON)
	}
	return w.here(), fmt.Sprintf("the Avro type %s is not supported", s.Type())
}

// value writes v, a payload's JSON, in s after what buf holds, in two
// passes if need be. The first is dry: a union's branch kept for an
// object or an array (w.unions) is not written again (skipped), as
// writing it again walks the value again each time a union around it is
// written again (some 4·d² steps for unions of records nested d deep;
// keeping the bytes instead costs memory by d²). If one was skipped and
// v fits, the second pass writes v, each union's kept branch at once:
// each value once (some 25·d steps in all).
func (w *jsonAvroWriter) value(s avro.Schema, v any) (field, reason string) {
	start := len(w.buf)
	w.dry = true
	field, reason = w.write(s, v, false)
	w.dry = false
	if w.skipped && reason == "" && !w.over {
		w.buf = w.buf[:start]
		field, reason = w.write(s, v, false)
	}
	return field, reason
}

// blocks writes n items of an array or a map as hamba/avro does: blocks
// of up to avroBlockLength items, each after its count, negated, and its
// size in bytes (a block of no bytes after its count only), then a block
// of none.
func (w *jsonAvroWriter) blocks(n int, item func(i int) (string, string)) (string, string) {
	var head [2 * binary.MaxVarintLen64]byte
	for i := 0; i < n; i += avroBlockLength {
		start := len(w.buf)
		count := 0
		for j := i; j < n && j < i+avroBlockLength; j++ {
			if f, r := item(j); r != "" || w.over {
				return f, r
			}
			count++
		}
		size := len(w.buf) - start
		h := head[:0]
		if size > 0 {
			h = binary.AppendUvarint(h, zigzag(-int64(count)))
			h = binary.AppendUvarint(h, zigzag(int64(size)))
		} else {
			h = binary.AppendUvarint(h, zigzag(int64(count)))
		}
		w.buf = append(w.buf, h...)
		copy(w.buf[start+len(h):], w.buf[start:start+size])
		copy(w.buf[start:], h)
	}
	w.long(0)
	return "", ""
}

func zigzag(n int64) uint64 { return uint64(n<<1) ^ uint64(n>>63) }

// record writes a record: its fields in order, a missing one's default.
func (w *jsonAvroWriter) record(rs *avro.RecordSchema, v any, avroJSON bool) (string, string) {
	m, ok := v.(map[string]any)
	if !ok {
		return w.here(), fmt.Sprintf("want %s, got %s", avroTypeName(rs), jsonType(v))
	}
	for _, f := range rs.Fields() {
		e, present := m[f.Name()]
		if present {
			if ff, r := w.in(pathToken{name: f.Name()}, f.Type(), e, avroJSON); r != "" || w.over {
				return ff, r
			}
			continue
		}
		fp := func() string { return w.here() + "/" + pointerToken(f.Name()) }
		if !f.HasDefault() {
			return fp(), fmt.Sprintf("missing: the field %s of the record %s is required (it has no default)", f.Name(), rs.FullName())
		}
		d := w.defaultOf(f)
		switch {
		case d.reason != "":
			return fp() + d.field, d.reason
		case d.fromValue:
			if w.depth >= maxDefaultDepth {
				return fp(), fmt.Sprintf("the default of %s nests defaults more than %d deep", f.Name(), maxDefaultDepth)
			}
			w.depth++
			ff, r := w.in(pathToken{name: f.Name()}, f.Type(), f.Default(), true)
			w.depth--
			if r != "" || w.over {
				return ff, r
			}
		default:
			if w.room(len(d.bytes)) {
				w.buf = append(w.buf, d.bytes...)
			}
		}
		if w.over {
			return "", ""
		}
	}
	for k := range m {
		if !hasField(rs, k) {
			return w.here() + "/" + pointerToken(k), fmt.Sprintf("the record %s has no field %s", rs.FullName(), k)
		}
	}
	return "", ""
}
