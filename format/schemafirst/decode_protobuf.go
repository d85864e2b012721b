package schemafirst

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/walrelay/walrelay/format"
)

// ErrProtobufLimit is a Protobuf message that would decode into more
// than DecodedBudget (an estimate), or nests deeper than
// MaxProtobufDepth.
var ErrProtobufLimit = errors.New("beyond the bounds of a Protobuf message")

// MaxProtobufDepth is how deep messages may nest in one Protobuf message
// that CheckProtobuf takes (Go's protobuf's own recursion limit).
const MaxProtobufDepth = protowire.DefaultRecursionLimit

// The estimated cost in memory of a Protobuf message decoded (calibrated
// on the inbox's decode into an any, its peak: dynamicpb's message,
// protojson's text of it, encoding/json's values of the text), by what
// its wire format holds.
const (
	pbCostMessage = 448 // a message: dynamicpb's, its JSON object, an empty map[string]any
	pbCostFields  = 400 // the maps of a message with a field set (dynamicpb's and encoding/json's)
	pbCostField   = 64  // a field set: its value in dynamicpb, its key and value in JSON and in the map
	pbCostItem    = 240 // an element of a repeated field or map (a packed one's too): in dynamicpb's list, its JSON and []any, as they grow
	pbCostBytes   = 48  // a string's or bytes' header (and its length, twice: base64 in JSON)
	pbCostUnknown = 64  // an unknown field, kept as its bytes (and 4 times its length)
)

// CheckProtobuf walks msg, a message of md in Protobuf's wire format,
// without allocating, and returns an ErrProtobufLimit error if what it
// decodes into (dynamicpb, protojson, encoding/json: the inbox's decode)
// would cost more than DecodedBudget(len(msg), bound) (an estimate: a
// repeated empty message, 2 bytes, costs some 350), or if it nests
// deeper than MaxProtobufDepth. A google.protobuf.Any's value counts as
// its bytes and, when its type URL names a type that protojson resolves
// (the program's: every well-known type), as a message of that type too:
// protojson expands it. A message that is not well-formed is left to
// proto.Unmarshal to refuse (the walk stops there).
func CheckProtobuf(md protoreflect.MessageDescriptor, msg []byte, bound int) error {
	w := pbWalk{budget: format.DecodedBudget(len(msg), bound)}
	if err := w.message(md, msg, 0, false); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrProtobufLimit, md.FullName(), err)
	}
	return nil
}

// google.protobuf.Any and its fields' numbers.
const (
	anyFullName = wellKnownPackage + ".Any"
	anyTypeURL  = 1
	anyValue    = 2
)

type pbWalk struct {
	cost, budget int
}

func (w *pbWalk) add(n int) error {
	w.cost += n
	if w.cost > w.budget {
		return fmt.Errorf("decodes into more than %d bytes (an estimate of what is built of it)", w.budget)
	}
	return nil
}

// message walks b, a message of md (or a group's fields; entry: a map's
// entry, whose cost its item counts).
func (w *pbWalk) message(md protoreflect.MessageDescriptor, b []byte, depth int, entry bool) error {
	if depth > MaxProtobufDepth {
		return fmt.Errorf("nested deeper than %d", MaxProtobufDepth)
	}
	c := pbCostMessage
	if entry {
		c = pbCostField // its key and value in dynamicpb's map (its item counted)
	}
	if err := w.add(c); err != nil {
		return err
	}
	fields := entry
	// A google.protobuf.Any: its value counts as bytes, and as the
	// message its type URL names too, if protojson can resolve it.
	anyMsg := md != nil && md.FullName() == anyFullName
	var typeURL, value []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil // proto.Unmarshal refuses it
		}
		b = b[n:]
		var fd protoreflect.FieldDescriptor
		if md != nil {
			fd = md.Fields().ByNumber(num)
		}
		if fd == nil { // unknown: kept as its bytes
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil
			}
			if err := w.add(pbCostUnknown + 4*(n+protowire.SizeTag(num))); err != nil {
				return err
			}
			b = b[n:]
			continue
		}
		c := pbCostField
		if fd.IsList() || fd.IsMap() {
			c = pbCostItem
		}
		if !fields {
			fields = true
			c += pbCostFields
		}
		if err := w.add(c); err != nil {
			return err
		}
		var err error
		switch {
		case fd.Kind() == protoreflect.GroupKind && typ == protowire.StartGroupType:
			v, n := protowire.ConsumeGroup(num, b)
			if n < 0 {
				return nil
			}
			err, b = w.message(fd.Message(), v, depth+1, false), b[n:]
		case (fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			err, b = w.message(fd.Message(), v, depth+1, fd.IsMap()), b[n:]
		case fd.IsList() && typ == protowire.BytesType && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind:
			v, n := protowire.ConsumeBytes(b) // packed: each element costs
			if n < 0 {
				return nil
			}
			err, b = w.packed(fd.Kind(), v), b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil
			}
			if typ == protowire.BytesType {
				err = w.add(pbCostBytes + 2*n)
				if anyMsg {
					v, _ := protowire.ConsumeBytes(b)
					switch {
					case fd.Number() == anyTypeURL && fd.Kind() == protoreflect.StringKind:
						typeURL = v
					case fd.Number() == anyValue && fd.Kind() == protoreflect.BytesKind:
						value = v
					}
				}
			}
			b = b[n:]
		}
		if err != nil {
			return err
		}
	}
	if anyMsg && len(typeURL) > 0 {
		return w.expandAny(string(typeURL), value, depth)
	}
	return nil
}

// expandAny walks value, an Any's, as the message of typeURL: protojson
// (the inbox's decode into an any, Decoded.JSON) writes an Any by
// decoding its value into a message of the type its URL names, with its
// default resolver, the program's registry, where every well-known type
// is linked in (a ListValue of empty Structs, 4 bytes an element, costs
// as much expanded as outside an Any). A type it cannot resolve fails
// protojson: its value stays counted as bytes.
func (w *pbWalk) expandAny(typeURL string, value []byte, depth int) error {
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
	if err != nil {
		return nil
	}
	return w.message(mt.Descriptor(), value, depth+1, false)
}

// packed counts the elements of a packed repeated field of kind k: a
// fixed32 or fixed64 each, a varint by its last byte.
func (w *pbWalk) packed(k protoreflect.Kind, v []byte) error {
	var n int
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		n = len(v) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		n = len(v) / 8
	default:
		for _, c := range v {
			if c < 0x80 {
				n++
			}
		}
	}
	return w.add(n * pbCostItem)
}
