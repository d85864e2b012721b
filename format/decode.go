package format

import (
	"errors"
	"fmt"
	"math"

	"github.com/hamba/avro/v2"
)

// Bounds of one Avro datum that a consumer decodes (DecodeAvroWith,
// UnmarshalAvro), checked by a walk of its bytes before hamba/avro
// decodes them: hamba/avro allocates what a block count or a fixed's size
// says before it reads, and recurses as deep as a recursive schema's
// datum nests, so one record of a few bytes could otherwise end the
// process (a fatal out-of-memory or stack overflow, which no recover
// catches).
const (
	// MaxAvroDepth is how deep records, arrays and maps may nest in one
	// datum (a recursive schema's linked list of that many).
	MaxAvroDepth = 1000
	// MaxAvroEmptyItems is how many array items that take no bytes (a
	// null, an empty record, a fixed of 0) one datum may hold in all.
	MaxAvroEmptyItems = 1 << 20
)

// ErrAvroLimit is an Avro datum beyond a bound of MaxAvroDepth or
// MaxAvroEmptyItems, or that says it is longer than it is (a string, a
// bytes, a fixed or a block count beyond its remaining bytes).
var ErrAvroLimit = errors.New("beyond the bounds of an Avro datum")

// AvroDecodeConfig returns a hamba/avro configuration to decode with
// (DecodeAvroWith, UnmarshalAvro): strings and bytes as long as a datum
// (hamba/avro's default stops at 1 MiB, short of what walrelay's own
// avro format writes), as the walk before the decode bounds them by the
// datum's own length.
func AvroDecodeConfig() avro.API {
	return avro.Config{MaxByteSliceSize: math.MaxInt32, MaxSliceAllocSize: math.MaxInt32}.Freeze()
}

// DecodeAvroWith is DecodeAvro with the schema already parsed (a
// consumer's cache of the registry's schemas by id) and the hamba/avro
// configuration to decode with (which keeps a decoder per schema as long
// as it lives: a consumer's, that goes with its cache, rather than
// hamba/avro's package-wide DefaultConfig, which keeps them for ever;
// AvroDecodeConfig's). A datum beyond the bounds is ErrAvroLimit.
func DecodeAvroWith(api avro.API, s avro.Schema, body []byte) (any, error) {
	var v any
	if err := UnmarshalAvro(api, s, body, &v); err != nil {
		return nil, err
	}
	return unwrap(s, v), nil
}

// UnmarshalAvro decodes body, a datum of s, into v with api, after a walk
// of body that checks it is within the bounds (ErrAvroLimit).
func UnmarshalAvro(api avro.API, s avro.Schema, body []byte, v any) error {
	if err := CheckAvro(s, body); err != nil {
		return fmt.Errorf("decode in Avro: %w", err)
	}
	if err := api.Unmarshal(s, body, v); err != nil {
		return fmt.Errorf("decode in Avro: %w", err)
	}
	return nil
}

// CheckAvro walks body, a datum of s in Avro's binary encoding, without
// allocating, and returns an ErrAvroLimit error if it nests deeper than
// MaxAvroDepth, holds more than MaxAvroEmptyItems empty items, or says a
// length longer than its remaining bytes (or is cut short).
func CheckAvro(s avro.Schema, body []byte) error {
	w := avroWalk{b: body, empty: map[avro.Schema]int{}}
	if err := w.datum(s, 0); err != nil {
		return fmt.Errorf("%w: %s", ErrAvroLimit, err)
	}
	return nil
}

type avroWalk struct {
	b     []byte
	n     int                 // empty items so far
	empty map[avro.Schema]int // emptiness by schema: 1 empty, 2 not, 3 in progress
}

func (w *avroWalk) long() (int64, error) {
	var u uint64
	for i := 0; ; i++ {
		if i == len(w.b) {
			return 0, errors.New("cut short")
		}
		if i == 10 {
			return 0, errors.New("a varint longer than 10 bytes")
		}
		c := w.b[i]
		u |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			w.b = w.b[i+1:]
			return int64(u>>1) ^ -int64(u&1), nil
		}
	}
}

func (w *avroWalk) skip(n int64, what string) error {
	if n < 0 || n > int64(len(w.b)) {
		return fmt.Errorf("a %s of %d bytes, %d left", what, n, len(w.b))
	}
	w.b = w.b[n:]
	return nil
}

// isEmpty reports whether every datum of s takes no bytes (a null, a
// fixed of 0, a record of such): a record that contains itself with no
// union between is never complete, and is not empty (its walk ends at
// MaxAvroDepth).
func (w *avroWalk) isEmpty(s avro.Schema) bool {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	switch w.empty[s] {
	case 1:
		return true
	case 2, 3:
		return false
	}
	w.empty[s] = 3
	e := false
	switch x := s.(type) {
	case *avro.NullSchema:
		e = true
	case *avro.FixedSchema:
		e = x.Size() == 0
	case *avro.RecordSchema:
		e = true
		for _, f := range x.Fields() {
			if !w.isEmpty(f.Type()) {
				e = false
				break
			}
		}
	}
	if e {
		w.empty[s] = 1
	} else {
		w.empty[s] = 2
	}
	return e
}

func (w *avroWalk) datum(s avro.Schema, depth int) error {
	if depth > MaxAvroDepth {
		return fmt.Errorf("nested deeper than %d", MaxAvroDepth)
	}
	switch x := s.(type) {
	case *avro.RefSchema:
		return w.datum(x.Schema(), depth)
	case *avro.NullSchema:
		return nil
	case *avro.RecordSchema:
		for _, f := range x.Fields() {
			if err := w.datum(f.Type(), depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.FixedSchema:
		return w.skip(int64(x.Size()), "fixed")
	case *avro.EnumSchema:
		i, err := w.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(len(x.Symbols())) {
			return fmt.Errorf("enum symbol %d of %d", i, len(x.Symbols()))
		}
		return nil
	case *avro.UnionSchema:
		i, err := w.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(len(x.Types())) {
			return fmt.Errorf("union branch %d of %d", i, len(x.Types()))
		}
		return w.datum(x.Types()[i], depth) // the record or array in it counts
	case *avro.ArraySchema:
		return w.blocks(depth, nil, x.Items())
	case *avro.MapSchema:
		return w.blocks(depth, avro.NewPrimitiveSchema(avro.String, nil), x.Values())
	}
	switch s.Type() {
	case avro.Boolean:
		return w.skip(1, "boolean")
	case avro.Int, avro.Long:
		_, err := w.long()
		return err
	case avro.Float:
		return w.skip(4, "float")
	case avro.Double:
		return w.skip(8, "double")
	case avro.String, avro.Bytes:
		n, err := w.long()
		if err != nil {
			return err
		}
		return w.skip(n, string(s.Type()))
	case avro.Null:
		return nil
	}
	return fmt.Errorf("a schema of type %s", s.Type())
}

// blocks walks an array's (key nil) or a map's blocks of items.
func (w *avroWalk) blocks(depth int, key, items avro.Schema) error {
	empty := key == nil && w.isEmpty(items)
	for {
		n, err := w.long()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if n < 0 {
			if n == math.MinInt64 {
				return fmt.Errorf("a block count of %d", n)
			}
			n = -n
			if _, err := w.long(); err != nil { // the block's size in bytes
				return err
			}
		}
		if empty {
			if n > int64(MaxAvroEmptyItems-w.n) {
				return fmt.Errorf("more than %d items that take no bytes", MaxAvroEmptyItems)
			}
			w.n += int(n)
			continue
		}
		if n > int64(len(w.b)) { // each item takes a byte at least
			return fmt.Errorf("a block of %d items, %d bytes left", n, len(w.b))
		}
		for range n {
			if key != nil {
				if err := w.datum(key, depth+1); err != nil {
					return err
				}
			}
			if err := w.datum(items, depth+1); err != nil {
				return err
			}
		}
	}
}
