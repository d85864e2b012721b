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
	// null, an empty record, a fixed of 0) one datum may hold in all
	// (each costs some 16 to 64 bytes decoded, within DecodedBudget too;
	// walrelay's avro format writes none: its items are optional, a
	// union's index byte each).
	MaxAvroEmptyItems = 1 << 19
)

// MaxDecodedBytes is the default bound of what one decoded key or value
// may cost in memory (DecodedBudget): the heap that hamba/avro (Avro
// into a Go value) or dynamicpb, protojson and encoding/json (Protobuf)
// build of it, estimated by the walk before the decode (CheckAvro,
// CheckProtobuf) at some 10-20% above what they build into an any. A
// datum's bytes are bounded by the record's, but not what is built of
// them: a record of one int, 1 byte of datum, is a map[string]any of
// some 360 bytes; an empty record, 0 bytes, 64 bytes; a 1 MiB Kafka
// record could otherwise hold hundreds of MiB (the consumer's
// out-of-memory kill, again at every restart on the same record).
//
// What walrelay's avro format writes of a JSON payload of 1 MB (the
// default record cap) decodes within it for objects of some 20 bytes of
// JSON or more, arrays of numbers, strings or nulls; not 125,000 objects
// of one field ({"a":1}: hamba/avro builds a map of the union's branch
// and one of the record for each, some 90 MiB at its peak), which is
// refused (the inbox's RegistryConfig.MaxDecodedBytes raises the bound).
const MaxDecodedBytes = 64 << 20

// decodedPerByte is how many bytes of decoded value one byte of datum
// may cost when the datum is larger than DecodedBudget's floor allows.
const decodedPerByte = 256

// DecodedBudget is the bound of the estimated decoded cost of a datum of
// n bytes, within bound (MaxDecodedBytes when 0 or less): half of
// bound whatever the datum (a 5-byte datum of 2^19 empty records costs
// some 40 MiB decoded, and is refused), 256 bytes a byte of datum
// beyond, up to bound (from a datum of bound/256 bytes: 256 KiB for 64
// MiB). Strings and bytes cost their length (a 2 MiB string, 2 MiB),
// so the bound grows by the datum's length too.
func DecodedBudget(n, bound int) int {
	if bound <= 0 {
		bound = MaxDecodedBytes
	}
	return min(bound, max(bound/2, decodedPerByte*n)) + n
}

// ErrAvroLimit is an Avro datum beyond a bound of MaxAvroDepth,
// MaxAvroEmptyItems or DecodedBudget, or that says it is longer than it
// is (a string, a bytes, a fixed or a block count beyond its remaining
// bytes).
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
	return DecodeAvroWithin(api, s, body, MaxDecodedBytes)
}

// DecodeAvroWithin is DecodeAvroWith, its decoded cost bounded by
// DecodedBudget(len(body), bound).
func DecodeAvroWithin(api avro.API, s avro.Schema, body []byte, bound int) (any, error) {
	var v any
	if err := UnmarshalAvroWithin(api, s, body, &v, bound); err != nil {
		return nil, err
	}
	return unwrap(s, v), nil
}

// UnmarshalAvro decodes body, a datum of s, into v with api, after a walk
// of body that checks it is within the bounds (ErrAvroLimit).
func UnmarshalAvro(api avro.API, s avro.Schema, body []byte, v any) error {
	return UnmarshalAvroWithin(api, s, body, v, MaxDecodedBytes)
}

// UnmarshalAvroWithin is UnmarshalAvro, its decoded cost bounded by
// DecodedBudget(len(body), bound).
func UnmarshalAvroWithin(api avro.API, s avro.Schema, body []byte, v any, bound int) error {
	if err := CheckAvroWithin(s, body, bound); err != nil {
		return fmt.Errorf("decode in Avro: %w", err)
	}
	if err := api.Unmarshal(s, body, v); err != nil {
		return fmt.Errorf("decode in Avro: %w", err)
	}
	return nil
}

// CheckAvro walks body, a datum of s in Avro's binary encoding, without
// allocating, and returns an ErrAvroLimit error if it nests deeper than
// MaxAvroDepth, holds more than MaxAvroEmptyItems empty items, would
// decode into more than DecodedBudget(len(body), MaxDecodedBytes) (an
// estimate), or says a length longer than its remaining bytes (or is cut
// short).
func CheckAvro(s avro.Schema, body []byte) error {
	return CheckAvroWithin(s, body, MaxDecodedBytes)
}

// CheckAvroWithin is CheckAvro, the decoded cost bounded by
// DecodedBudget(len(body), bound).
func CheckAvroWithin(s avro.Schema, body []byte, bound int) error {
	w := avroWalk{b: body, empty: map[avro.Schema]int{}, budget: DecodedBudget(len(body), bound)}
	if err := w.datum(s, 0); err != nil {
		return fmt.Errorf("%w: %s", ErrAvroLimit, err)
	}
	return nil
}

// The estimated cost in memory of what hamba/avro builds of a datum
// decoded into an any (calibrated on Go 1.26's heap, a little above what
// is measured, transient maps included): a value counts its slot in the
// []any or map that holds it.
const (
	avroCostNull   = 16  // nil in a slot
	avroCostScalar = 24  // a number or boolean boxed in a slot
	avroCostTime   = 40  // a time.Time or time.Duration (an int or long's logical type) boxed in a slot
	avroCostString = 32  // and its length: a string header boxed in a slot
	avroCostBytes  = 40  // and its length: a slice header boxed in a slot
	avroCostBig    = 128 // a decimal's *big.Rat (and its length), in bytes or in a fixed
	avroCostEmpty  = 64  // an empty map[string]any (a record of no field, a map of no entry)
	avroCostMap    = 336 // a map[string]any of its first entries (a record, a non-empty map, a union's wrapper)
	avroCostEntry  = 48  // a field or entry of a map beyond its slot
	avroCostArray  = 48  // a []any boxed in a slot
)

// fixedCost is the cost of a datum of fixed s beyond its size: a
// decimal carried in it decodes into a *big.Rat, as one in bytes does.
func fixedCost(s *avro.FixedSchema) int {
	if l := s.Logical(); l != nil && l.Type() == avro.Decimal {
		return avroCostBig
	}
	return avroCostBytes
}

type avroWalk struct {
	b      []byte
	n      int                 // empty items so far
	empty  map[avro.Schema]int // emptiness by schema: 1 empty, 2 not, 3 in progress
	cost   int                 // estimated decoded cost so far
	budget int                 // bound of cost

	emptyCosts map[avro.Schema]int // emptyCost by schema
}

// add counts n bytes of decoded cost, an error past the budget.
func (w *avroWalk) add(n int) error {
	w.cost += n
	if w.cost > w.budget {
		return fmt.Errorf("decodes into more than %d bytes (an estimate of what is built of it)", w.budget)
	}
	return nil
}

// emptyCost is the decoded cost of one datum of s, an empty schema
// (isEmpty), at most a little over the budget: kept by schema, as a
// record of two fields of a record of two fields, and so on 60 deep,
// would otherwise cost 2^60.
func (w *avroWalk) emptyCost(s avro.Schema) int {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if c, ok := w.emptyCosts[s]; ok {
		return c
	}
	c := avroCostNull
	switch x := s.(type) {
	case *avro.FixedSchema:
		c = fixedCost(x)
	case *avro.RecordSchema:
		c = avroCostEmpty
		if len(x.Fields()) > 0 {
			c = avroCostMap
		}
		for _, f := range x.Fields() {
			c = min(c+avroCostEntry+w.emptyCost(f.Type()), w.budget+1)
		}
	}
	if w.emptyCosts == nil {
		w.emptyCosts = map[avro.Schema]int{}
	}
	w.emptyCosts[s] = c
	return c
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
		return w.add(avroCostNull)
	case *avro.RecordSchema:
		c := avroCostEmpty
		if n := len(x.Fields()); n > 0 {
			c = avroCostMap + n*avroCostEntry
		}
		if err := w.add(c); err != nil {
			return err
		}
		for _, f := range x.Fields() {
			if err := w.datum(f.Type(), depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.FixedSchema:
		if err := w.add(fixedCost(x) + x.Size()); err != nil {
			return err
		}
		return w.skip(int64(x.Size()), "fixed")
	case *avro.EnumSchema:
		if err := w.add(avroCostString); err != nil { // its symbol, boxed
			return err
		}
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
		t := x.Types()[i]
		if r, ok := t.(*avro.RefSchema); ok {
			t = r.Schema()
		}
		switch t.(type) {
		case *avro.RecordSchema, *avro.ArraySchema, *avro.MapSchema, *avro.EnumSchema, *avro.FixedSchema:
			// hamba/avro wraps the branch's value in a map of its name,
			// which unwrap drops after the whole datum is decoded
			if err := w.add(avroCostMap); err != nil {
				return err
			}
		}
		return w.datum(t, depth) // the record or array in it counts
	case *avro.ArraySchema:
		if err := w.add(avroCostArray); err != nil {
			return err
		}
		return w.blocks(depth, nil, x.Items())
	case *avro.MapSchema:
		if err := w.add(avroCostEmpty); err != nil {
			return err
		}
		return w.blocks(depth, avro.NewPrimitiveSchema(avro.String, nil), x.Values())
	}
	switch s.Type() {
	case avro.Boolean:
		if err := w.add(avroCostScalar); err != nil {
			return err
		}
		return w.skip(1, "boolean")
	case avro.Int, avro.Long:
		c := avroCostScalar
		if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
			c = avroCostTime
		}
		if err := w.add(c); err != nil {
			return err
		}
		_, err := w.long()
		return err
	case avro.Float:
		if err := w.add(avroCostScalar); err != nil {
			return err
		}
		return w.skip(4, "float")
	case avro.Double:
		if err := w.add(avroCostScalar); err != nil {
			return err
		}
		return w.skip(8, "double")
	case avro.String, avro.Bytes:
		n, err := w.long()
		if err != nil {
			return err
		}
		if err := w.skip(n, string(s.Type())); err != nil {
			return err
		}
		c := avroCostString
		if s.Type() == avro.Bytes {
			c = avroCostBytes
			if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil && l.Logical().Type() == avro.Decimal {
				c = avroCostBig
			}
		}
		return w.add(c + int(n))
	case avro.Null:
		return w.add(avroCostNull)
	}
	return fmt.Errorf("a schema of type %s", s.Type())
}

// blocks walks an array's (key nil) or a map's blocks of items.
func (w *avroWalk) blocks(depth int, key, items avro.Schema) error {
	empty := key == nil && w.isEmpty(items)
	grown := false
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
			if err := w.add(int(n) * w.emptyCost(items)); err != nil {
				return err
			}
			continue
		}
		if n > int64(len(w.b)) { // each item takes a byte at least
			return fmt.Errorf("a block of %d items, %d bytes left", n, len(w.b))
		}
		if key != nil && !grown {
			grown = true // the map's first entries: it grows from empty
			if err := w.add(avroCostMap - avroCostEmpty); err != nil {
				return err
			}
		}
		for range n {
			if key != nil {
				if err := w.add(avroCostEntry); err != nil {
					return err
				}
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
