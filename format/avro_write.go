package format

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Writing a value in Avro's binary encoding straight from its Connect
// schema and its parsed JSON, in one pass (the time linear in the value;
// nothing kept between values, whatever their shape), the bytes Avro's
// Java library writes (GenericDatumWriter with a BinaryEncoder, as
// Debezium's converter writes them):
//   - int and long a zigzag varint, double 8 bytes little-endian (IEEE
//     754), boolean one byte 0 or 1;
//   - string and bytes a zigzag varint length then the bytes (a string in
//     UTF-8);
//   - an optional value (the union ["null", T]) its branch's index, 0 for
//     null or 1, then the value;
//   - a record its fields in order;
//   - an array one block: its count then its items, then 0 (an empty
//     array only the 0; no block byte size, as Java writes it).

// EncodeAvro writes n, a value of the Connect schema s that a translated
// into, in Avro's binary encoding (without framing). A value that does not
// fit s (null in a required schema, a JSON string in an int field, an
// integer beyond 64 bits in a double one) is an error naming its place.
func (a *AvroSchema) EncodeAvro(s *ConnectSchema, n *Node) ([]byte, error) {
	return encodeAvro(s, n, 64)
}

// encodeAvro is EncodeAvro into a buffer of capacity size.
func encodeAvro(s *ConnectSchema, n *Node, size int) ([]byte, error) {
	w := avroBinary{b: make([]byte, 0, size)}
	if err := w.value(s, n); err != nil {
		return nil, err
	}
	return w.b, nil
}

type avroBinary struct{ b []byte }

// value appends n, of schema s (with its union branch if s is optional).
func (w *avroBinary) value(s *ConnectSchema, n *Node) error {
	if n == nil || n.Kind == KindNull {
		if s.Required {
			return &encodeError{msg: "null in a required " + s.Type}
		}
		w.b = append(w.b, 0) // the union's branch 0, null
		return nil
	}
	if !s.Required {
		w.b = append(w.b, 2) // the union's branch 1 (zigzag)
	}
	return w.base(s, n)
}

func (w *avroBinary) base(s *ConnectSchema, n *Node) error {
	mismatch := func() error {
		return &encodeError{msg: fmt.Sprintf("a JSON %s in a field of type %s", kindName(n.Kind), s.Type)}
	}
	switch s.Type {
	case "string", "bytes":
		if n.Kind != KindString {
			return mismatch()
		}
		w.long(int64(len(n.Text)))
		w.b = append(w.b, n.Text...)
		return nil
	case "boolean":
		if n.Kind != KindBool {
			return mismatch()
		}
		if n.Bool {
			w.b = append(w.b, 1)
		} else {
			w.b = append(w.b, 0)
		}
		return nil
	case "int32", "int64":
		// An int64 schema takes only a literal beyond 32 bits (Jackson's
		// LongNode): an int in it (a merged record's field) is an Integer
		// that Connect's Struct refuses in INT64, as Debezium fails.
		if n.Kind != KindInt32 && n.Kind != KindInt64 || s.Type == "int64" && n.Kind != KindInt64 {
			return mismatch()
		}
		v, err := strconv.ParseInt(n.Text, 10, 64)
		if err != nil {
			return &encodeError{msg: err.Error(), err: err}
		}
		if s.Type == "int32" && (v < math.MinInt32 || v > math.MaxInt32) {
			return mismatch()
		}
		w.long(v)
		return nil
	case "int16":
		// An aggregate id of a smallint column (KeySchemaOf): Avro's int.
		v, err := strconv.ParseInt(n.Text, 10, 64)
		if n.Kind != KindInt32 || err != nil || v < math.MinInt16 || v > math.MaxInt16 {
			return mismatch()
		}
		w.long(v)
		return nil
	case "double":
		f, err := avroDouble(n)
		if err != nil {
			return err
		}
		if f == nil {
			return mismatch()
		}
		w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(*f))
		return nil
	case "array":
		if n.Kind != KindArray {
			return mismatch()
		}
		if len(n.Elems) > 0 {
			w.long(int64(len(n.Elems)))
			for i, e := range n.Elems {
				if err := w.value(s.Items, e); err != nil {
					return at(err, "["+strconv.Itoa(i)+"]")
				}
			}
		}
		w.b = append(w.b, 0) // the end of the array
		return nil
	case "struct":
		if n.Kind != KindObject {
			return mismatch()
		}
		for _, f := range s.Fields {
			if err := w.value(f.Schema, n.Field(f.Name)); err != nil {
				return at(err, "."+f.Name)
			}
		}
		return nil
	}
	return fmt.Errorf("connect type %q has no Avro encoding here", s.Type)
}

// avroDouble is the double of a number node in a double schema; nil (no
// error) if n is no number that a double takes.
func avroDouble(n *Node) (*float64, error) {
	switch n.Kind {
	case KindFloat64:
		f, err := strconv.ParseFloat(n.Text, 64)
		if errors.Is(err, strconv.ErrRange) {
			// Beyond a double's range: ±Inf (or 0), as Jackson's
			// DoubleNode reads it and Debezium writes it.
			err = nil
		}
		if err != nil {
			return nil, &encodeError{msg: err.Error(), err: err}
		}
		return &f, nil
	case KindBigInt:
		// Jackson's BigIntegerNode in a double schema: Connect's
		// converter fails on it (a BigInteger is no Double).
		return nil, &encodeError{msg: "the integer " + n.Text + " is beyond 64 bits, which Debezium's converter cannot write as a double"}
	}
	return nil, nil
}

// long appends v as a zigzag varint.
func (w *avroBinary) long(v int64) {
	w.b = binary.AppendUvarint(w.b, uint64(v<<1)^uint64(v>>63))
}

// encodeError is a value that its schema cannot write, and where: the path
// is gathered on the way out (the innermost segment first), so that a
// value written costs no path.
type encodeError struct {
	rev []string // ".field" or "[index]", innermost first
	msg string
	err error
}

func (e *encodeError) Error() string {
	var b strings.Builder
	for i := len(e.rev) - 1; i >= 0; i-- {
		b.WriteString(e.rev[i])
	}
	return pathOr(strings.TrimPrefix(b.String(), ".")) + ": " + e.msg
}

func (e *encodeError) Unwrap() error { return e.err }

// at adds the segment seg in front of an encodeError's path.
func at(err error, seg string) error {
	if e, ok := err.(*encodeError); ok {
		e.rev = append(e.rev, seg)
	}
	return err
}

// ErrTooLarge is a value whose encoding would be larger than the record
// size the sink can publish (Payload.MaxBytes): it is not written, and the
// event goes to the dead-letter topic (too_large).
var ErrTooLarge = errors.New("the value would be larger than a record can be")

// AvroSize is the length of the Avro encoding of n in s, as EncodeAvro
// writes it, counted without writing it: the time is linear in n and s
// (not in the output, which is not: each element of an array of records
// writes a null for each field it lacks, so a payload of E objects each
// with a key of its own writes E×E nulls). For a value that s cannot
// write, it is a guess: EncodeAvro fails on it.
func AvroSize(s *ConnectSchema, n *Node) int64 {
	var z avroSizer // its maps made at the first wide record
	return z.value(s, n)
}

// avroSizer counts, with the field indexes and null counts of the wide
// records met (made once per record schema).
type avroSizer struct {
	fields map[*ConnectSchema]map[string]int
	nulls  map[*ConnectSchema]int64 // the optional fields of a record
}

// sizeIndexFrom is the number of fields from which a record's size is
// counted by the keys of its value (not by its fields), when its value has
// fewer than half as many keys: a record merged from an array's objects.
const sizeIndexFrom = 16

func (z *avroSizer) value(s *ConnectSchema, n *Node) int64 {
	if n == nil || n.Kind == KindNull {
		if s.Required {
			return 0 // EncodeAvro fails
		}
		return 1
	}
	u := int64(1)
	if s.Required {
		u = 0
	}
	switch s.Type {
	case "string", "bytes":
		return u + longSize(int64(len(n.Text))) + int64(len(n.Text))
	case "boolean":
		return u + 1
	case "int16", "int32", "int64":
		v, _ := strconv.ParseInt(n.Text, 10, 64)
		return u + longSize(v)
	case "double":
		return u + 8
	case "array":
		if len(n.Elems) == 0 {
			return u + 1
		}
		size := u + longSize(int64(len(n.Elems))) + 1
		for _, e := range n.Elems {
			size += z.value(s.Items, e)
		}
		return size
	case "struct":
		if n.Kind != KindObject {
			return u
		}
		if len(s.Fields) < sizeIndexFrom || len(s.Fields) <= 2*len(n.Keys) {
			for _, f := range s.Fields {
				u += z.value(f.Schema, n.Field(f.Name))
			}
			return u
		}
		// A wide record: its nulls, then for each of the value's keys
		// that is a field, its value in place of its null.
		idx, ok := z.fields[s]
		if !ok {
			idx = make(map[string]int, len(s.Fields))
			var nulls int64
			for i, f := range s.Fields {
				idx[f.Name] = i
				if !f.Schema.Required {
					nulls++
				}
			}
			if z.fields == nil {
				z.fields, z.nulls = map[*ConnectSchema]map[string]int{}, map[*ConnectSchema]int64{}
			}
			z.fields[s], z.nulls[s] = idx, nulls
		}
		size := u + z.nulls[s]
		for i, k := range n.Keys {
			j, ok := idx[k]
			if !ok {
				continue // not a field (a null or [] left out)
			}
			f := s.Fields[j].Schema
			size += z.value(f, n.Elems[i])
			if !f.Required {
				size-- // its null
			}
		}
		return size
	}
	return u
}

// longSize is the length of v as a zigzag varint.
func longSize(v int64) int64 {
	x := uint64(v<<1) ^ uint64(v>>63)
	size := int64(1)
	for x >= 0x80 {
		x >>= 7
		size++
	}
	return size
}
