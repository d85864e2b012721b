package format

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoFile is the name the schema's .proto text is compiled under.
const protoFile = "walrelay-subject.proto"

// compileProtobuf compiles a Protobuf schema of the registry (the .proto
// text, with the files it imports: refs by import path, and Google's
// well-known types) and returns the writer of JSON payloads as message
// (full or simple name; "" for the file's first message): the JSON read
// as protojson reads it (proto3's JSON mapping: unknown fields refused),
// written in Protobuf after Confluent's message indexes.
func compileProtobuf(ctx context.Context, text string, refs map[string]string, message string, mismatch func(field, reason string) *MismatchError) (func(dst, payload []byte) ([]byte, *MismatchError), error) {
	fd, err := CompileProtobuf(ctx, text, refs)
	if err != nil {
		return nil, err
	}
	md, err := findMessage(fd, message)
	if err != nil {
		return nil, err
	}
	indexes := MessageIndexes(md)
	return func(dst, payload []byte) ([]byte, *MismatchError) {
		m := dynamicpb.NewMessage(md)
		if err := (protojson.UnmarshalOptions{}).Unmarshal(payload, m); err != nil {
			return nil, mismatch(protoField(md, err), protoReason(err))
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, mismatch("", protoReason(err))
		}
		return append(AppendMessageIndexes(dst, indexes), body...), nil
	}, nil
}

// CompileProtobuf compiles a Protobuf schema of the registry: the .proto
// text, with the files it imports (refs, by import path, as
// Registry.References gives them, and Google's well-known types).
func CompileProtobuf(ctx context.Context, text string, refs map[string]string) (protoreflect.FileDescriptor, error) {
	srcs := map[string]string{protoFile: text}
	for name, t := range refs {
		srcs[name] = t
	}
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(srcs)}),
	}
	files, err := c.Compile(ctx, protoFile)
	if err != nil {
		return nil, fmt.Errorf("compile the Protobuf schema: %w", err)
	}
	return files[0], nil
}

// findMessage finds the message to write: by full name, else by simple
// name anywhere in the file, or the file's first message.
func findMessage(fd protoreflect.FileDescriptor, name string) (protoreflect.MessageDescriptor, error) {
	if name == "" {
		if fd.Messages().Len() == 0 {
			return nil, fmt.Errorf("the Protobuf schema has no message")
		}
		return fd.Messages().Get(0), nil
	}
	var found protoreflect.MessageDescriptor
	var walk func(ms protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len() && found == nil; i++ {
			m := ms.Get(i)
			if string(m.FullName()) == name || string(m.Name()) == name {
				found = m
				return
			}
			walk(m.Messages())
		}
	}
	walk(fd.Messages())
	if found == nil {
		return nil, fmt.Errorf("the Protobuf schema (package %q) has no message %s", fd.Package(), name)
	}
	return found, nil
}

// MessageIndexes is the path of md in its file, as Confluent's wire format
// names the message: its index among the file's messages, then within
// each enclosing message.
func MessageIndexes(md protoreflect.MessageDescriptor) []int {
	var path []int
	for d := protoreflect.Descriptor(md); ; d = d.Parent() {
		m, ok := d.(protoreflect.MessageDescriptor)
		if !ok {
			break
		}
		path = append([]int{m.Index()}, path...)
	}
	return path
}

// MessageByIndexes is the message of fd that Confluent's message indexes
// name (MessageIndexes' inverse): an error for indexes out of fd's
// messages.
func MessageByIndexes(fd protoreflect.FileDescriptor, indexes []int) (protoreflect.MessageDescriptor, error) {
	if len(indexes) == 0 {
		return nil, errors.New("no message indexes")
	}
	ms := fd.Messages()
	var md protoreflect.MessageDescriptor
	for depth, i := range indexes {
		if i < 0 || i >= ms.Len() {
			where := fmt.Sprintf("the schema (package %q)", fd.Package())
			if md != nil {
				where = "message " + string(md.FullName())
			}
			return nil, fmt.Errorf("message indexes %v: %s has %d message(s), no index %d (at depth %d)", indexes, where, ms.Len(), i, depth)
		}
		md = ms.Get(i)
		ms = md.Messages()
	}
	return md, nil
}

// maxIndexes bounds the message indexes read: a message nested deeper is
// not one a .proto file holds.
const maxIndexes = 64

// SplitMessageIndexes reads Confluent's message indexes at the start of
// body (the value after its 5-byte framing), with franz-go's
// sr.ConfluentHeader, and returns them and the Protobuf message after
// them.
func SplitMessageIndexes(body []byte) (indexes []int, msg []byte, err error) {
	var h sr.ConfluentHeader
	indexes, msg, err = h.DecodeIndex(body, maxIndexes)
	if err != nil {
		switch {
		case errors.Is(err, sr.ErrNotRegistered):
			err = fmt.Errorf("more than %d", maxIndexes)
		case errors.Is(err, sr.ErrBadHeader):
			err = errors.New("a negative count")
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			err = fmt.Errorf("truncated (%d bytes after the schema id)", len(body))
		}
		return nil, nil, fmt.Errorf("read the message indexes: %w", err)
	}
	return indexes, msg, nil
}

// AppendMessageIndexes appends Confluent's message indexes: their count
// then each, as zigzag varints; the first message ([0]) as a single 0.
func AppendMessageIndexes(dst []byte, indexes []int) []byte {
	if len(indexes) == 1 && indexes[0] == 0 {
		return append(dst, 0)
	}
	dst = binary.AppendVarint(dst, int64(len(indexes)))
	for _, i := range indexes {
		dst = binary.AppendVarint(dst, int64(i))
	}
	return dst
}

// protojsonField finds the field that protojson names in its error
// (`unknown field "x"`, `invalid value for int32 field qty: …`).
var protojsonField = regexp.MustCompile(`field "?([A-Za-z_][A-Za-z0-9_.]*)"?`)

// protoField is the field a protojson error names, as a JSON pointer
// from the message ("/qty"); nested messages' fields are named alone.
func protoField(md protoreflect.MessageDescriptor, err error) string {
	if m := protojsonField.FindStringSubmatch(err.Error()); m != nil {
		name := m[1]
		if i := strings.LastIndexByte(name, '.'); i >= 0 && strings.HasPrefix(name, string(md.FullName())+".") {
			name = name[i+1:]
		}
		return "/" + pointerToken(name)
	}
	return ""
}

// protoReason is a protobuf error's text without its "proto:" prefix
// (which the module writes with a space or a no-break space, at random, so
// that no one matches its errors' text).
func protoReason(err error) string {
	return strings.TrimLeft(strings.TrimPrefix(err.Error(), "proto:"), " \u00a0")
}
