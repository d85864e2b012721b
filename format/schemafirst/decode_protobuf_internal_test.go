package schemafirst

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/internal/testkit/heappeak"
)

// anyOf is a google.protobuf.Any of message value of type name, as
// field num of a message (0: the Any alone).
func anyOf(num protowire.Number, name string, value []byte) []byte {
	a := protowire.AppendTag(nil, 1, protowire.BytesType)
	a = protowire.AppendString(a, "type.googleapis.com/"+name)
	a = protowire.AppendTag(a, 2, protowire.BytesType)
	a = protowire.AppendBytes(a, value)
	if num == 0 {
		return a
	}
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), a)
}

// TestProtobufDecodedCostEstimate: CheckProtobuf's estimate of what the
// inbox builds of a Protobuf message decoded into an any (dynamicpb's
// message, protojson's text, encoding/json's values) is not below its
// peak of live heap measured, shape by shape: a newer protobuf or Go that
// builds more fails here, and the costs are calibrated again.
func TestProtobufDecodedCostEstimate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates more than the product: calibrated without it")
	}
	fd, err := CompileProtobuf(t.Context(), `syntax = "proto3"; package p; import "google/protobuf/any.proto"; message M { repeated E e = 1; repeated int32 p = 2; repeated string s = 3; map<string,int32> m = 4; repeated F f = 5; repeated int32 u = 10 [packed=false]; repeated G g = 6; repeated double d = 7; google.protobuf.Any a = 8; } message E {} message F { int32 a = 1; } message G { int32 a = 1; string b = 2; int64 c = 3; }`, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Messages().ByName("M")
	const n = 50000
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"empty messages", bytes.Repeat([]byte{0x0a, 0}, n)},
		{"packed int32", append(protowire.AppendVarint([]byte{0x12}, n), bytes.Repeat([]byte{1}, n)...)},
		{"packed double", append(protowire.AppendVarint([]byte{0x3a}, 8*n), make([]byte, 8*n)...)},
		{"empty strings", bytes.Repeat([]byte{0x1a, 0}, n)},
		{"map entries", func() []byte {
			var b []byte
			for i := range n {
				b = append(b, 0x22, 8, 0x0a, 4, byte('a'+i%26), byte('a'+i/26%26), byte('a'+i/676%26), byte('a'+i/17576%26), 0x10, 1)
			}
			return b
		}()},
		{"messages of one int", bytes.Repeat([]byte{0x2a, 2, 8, 1}, n)},
		{"unpacked int32", bytes.Repeat([]byte{0x50, 1}, n)},
		{"unknown fields", bytes.Repeat([]byte{0x78, 1}, n)},
		{"messages of three fields", bytes.Repeat([]byte{0x32, 9, 8, 1, 0x12, 3, 'a', 'b', 'c', 0x18, 5}, n)},
		// An Any's value expanded by protojson: a ListValue of Values of
		// an empty Struct; and the same Any in an Any.
		{"an Any of a ListValue", anyOf(8, "google.protobuf.ListValue", bytes.Repeat([]byte{0x0a, 2, 0x2a, 0}, n))},
		{"an Any of an Any", anyOf(8, "google.protobuf.Any", anyOf(0, "google.protobuf.ListValue", bytes.Repeat([]byte{0x0a, 2, 0x2a, 0}, n)))},
	} {
		w := pbWalk{budget: 1 << 40}
		if err := w.message(md, c.body, 0, false); err != nil {
			t.Fatal(err)
		}
		var derr error
		peak := heappeak.Of(func() {
			m := dynamicpb.NewMessage(md)
			if derr = proto.Unmarshal(c.body, m); derr != nil {
				return
			}
			js, err := protojson.Marshal(m)
			if derr = err; err != nil {
				return
			}
			var v any
			derr = json.Unmarshal(js, &v)
		})
		if derr != nil {
			t.Fatalf("%s: %v", c.name, derr)
		}
		t.Logf("%-24s %7d bytes: peak %5d, estimated %5d an element", c.name, len(c.body), peak/n, w.cost/n)
		if peak > uint64(w.cost)+uint64(w.cost)/4 { // the peak sampled varies by some 10%
			t.Errorf("%s: a peak of %d bytes an element, estimated %d", c.name, peak/n, w.cost/n)
		}
	}
}

// TestCheckProtobufExpandsAny (from review44's
// TestProbe44ProtobufAnyBypassesTheDecodedBound): CheckProtobuf counted a
// google.protobuf.Any's value as bytes, but protojson (the inbox's decode
// into an any) expands it when its type URL names a type of the program
// (every well-known type is linked in): a 1 MiB record of an Any of a
// ListValue of empty Structs, 4 bytes an element, decoded with a peak of
// 70 MB, 34 times the estimate, past the inbox's 64 MiB bound:
//
//	1048631 bytes of record: CheckProtobuf's estimate 2099234 bytes (budget 68157495), JSON 786505 bytes, peak heap 70066104 bytes (33x the estimate)
//
// The walk now counts the value as the message its type URL names, as
// protojson resolves it: that record is refused within the bound
// (ErrProtobufLimit); a type URL that does not resolve (protojson fails on
// it) leaves the value counted as bytes; a small Any passes.
func TestCheckProtobufExpandsAny(t *testing.T) {
	fd, err := CompileProtobuf(t.Context(), `syntax = "proto3"; package p; import "google/protobuf/any.proto"; message M { google.protobuf.Any a = 1; }`, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Messages().ByName("M")
	list := bytes.Repeat([]byte{0x0a, 2, 0x2a, 0}, 1<<18) // 1 MiB of ListValue.values, each Value{struct_value: {}}
	if err := CheckProtobuf(md, anyOf(1, "google.protobuf.ListValue", list), format.MaxDecodedBytes); !errors.Is(err, ErrProtobufLimit) {
		t.Errorf("an Any of a ListValue of 262144 empty Structs: %v, want ErrProtobufLimit", err)
	}
	nested := anyOf(1, "google.protobuf.Any", anyOf(0, "google.protobuf.ListValue", list))
	if err := CheckProtobuf(md, nested, format.MaxDecodedBytes); !errors.Is(err, ErrProtobufLimit) {
		t.Errorf("the same in an Any in an Any: %v, want ErrProtobufLimit", err)
	}
	unresolved := anyOf(1, "p.Nope", list)
	if err := CheckProtobuf(md, unresolved, format.MaxDecodedBytes); err != nil {
		t.Errorf("an Any of a type not resolved: %v, want it counted as bytes", err)
	}
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(unresolved, m); err != nil {
		t.Fatal(err)
	}
	if _, err := protojson.Marshal(m); err == nil {
		t.Errorf("protojson wrote an Any of a type it does not know")
	}
	ts := anyOf(1, "google.protobuf.Timestamp", []byte{0x08, 1})
	if err := CheckProtobuf(md, ts, format.MaxDecodedBytes); err != nil {
		t.Errorf("an Any of a Timestamp: %v", err)
	}
}
