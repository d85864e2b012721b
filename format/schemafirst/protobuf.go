package schemafirst

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
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
	return protobufWriter(md, mismatch), nil
}

// protobufWriter is the writer of JSON payloads as md (compileProtobuf's).
// A panic of Go's protobuf on md is the payload's mismatch, saying it is
// the schema's fault: protojson assumes that a message named as one of
// Google's well-known types (google.protobuf.Timestamp) has its fields,
// and CompileProtobuf refuses a schema where it has not, but a panic left
// to run would stop walrelay, and again at every restart on the event.
func protobufWriter(md protoreflect.MessageDescriptor, mismatch func(field, reason string) *MismatchError) func(dst, payload []byte) ([]byte, *MismatchError) {
	indexes := MessageIndexes(md)
	return func(dst, payload []byte) (out []byte, merr *MismatchError) {
		defer func() {
			if p := recover(); p != nil {
				out, merr = nil, mismatch("", fmt.Sprintf("the schema's message %s cannot be written: Go's protobuf panicked on it (%v): the schema is at fault, not the payload", md.FullName(), p))
			}
		}()
		m := dynamicpb.NewMessage(md)
		if err := (protojson.UnmarshalOptions{}).Unmarshal(payload, m); err != nil {
			return nil, mismatch(protoField(md, err), protoReason(err))
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, mismatch("", protoReason(err))
		}
		return append(AppendMessageIndexes(dst, indexes), body...), nil
	}
}

// CompileProtobuf compiles a Protobuf schema of the registry: the .proto
// text, with the files it imports (refs, by import path, as
// Registry.References gives them, and Google's well-known types).
//
// Google's well-known types are always protoc's own, the ones linked into
// the program: a reference under one of their import paths
// (google/protobuf/timestamp.proto) is not read (Confluent's serializers
// register Google's files as references of that name), and a schema or
// reference that declares one of their names (google.protobuf.Duration)
// with other fields than Google's is refused. protojson reads and writes
// a message of such a name by Google's fields, and panics on other ones.
func CompileProtobuf(ctx context.Context, text string, refs map[string]string) (protoreflect.FileDescriptor, error) {
	srcs := map[string]string{protoFile: text}
	for name, t := range refs {
		if name != protoFile {
			srcs[name] = t
		}
	}
	src := &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(srcs)}
	c := protocompile.Compiler{
		Resolver: protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
			if r, err := standardImports.FindFileByPath(path); err == nil {
				return r, nil
			}
			return src.FindFileByPath(path)
		}),
	}
	files, err := c.Compile(ctx, protoFile)
	if err != nil {
		return nil, fmt.Errorf("compile the Protobuf schema: %w", err)
	}
	if err := checkWellKnown(files[0]); err != nil {
		return nil, fmt.Errorf("the Protobuf schema: %w", err)
	}
	return files[0], nil
}

// standardImports resolves only the files that protoc includes (Google's
// well-known types and descriptor.proto), protocompile's own.
var standardImports = protocompile.WithStandardImports(protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
	return protocompile.SearchResult{}, fs.ErrNotExist
}))

// wellKnownPackage is the package of Google's well-known types.
const wellKnownPackage = "google.protobuf"

// checkWellKnown refuses fd if it, or a file it imports, declares a
// message or enum of package google.protobuf that the program links in
// (Google's) with another shape than Google's: protojson writes and reads
// those by their name, with Google's fields (a Timestamp's seconds an
// int64), and panics on a message of that name with other fields. A copy
// of Google's own declarations, or a name Google does not declare, is
// taken.
func checkWellKnown(fd protoreflect.FileDescriptor) error {
	seen := map[string]bool{}
	var file func(f protoreflect.FileDescriptor) error
	file = func(f protoreflect.FileDescriptor) error {
		if seen[f.Path()] {
			return nil
		}
		seen[f.Path()] = true
		if f.Package() == wellKnownPackage {
			if g, err := protoregistry.GlobalFiles.FindFileByPath(f.Path()); err != nil || g != f {
				if err := declarations(f.Messages(), f.Enums()); err != nil {
					return fmt.Errorf("%s declares %w", f.Path(), err)
				}
			}
		}
		for i := 0; i < f.Imports().Len(); i++ {
			if err := file(f.Imports().Get(i).FileDescriptor); err != nil {
				return err
			}
		}
		return nil
	}
	return file(fd)
}

// declarations checks messages and enums (and the ones nested in them)
// against Google's of the same names.
func declarations(ms protoreflect.MessageDescriptors, es protoreflect.EnumDescriptors) error {
	for i := 0; i < es.Len(); i++ {
		e := es.Get(i)
		g, err := protoregistry.GlobalFiles.FindDescriptorByName(e.FullName())
		if err != nil {
			continue
		}
		ge, ok := g.(protoreflect.EnumDescriptor)
		if why := sameEnum(e, ge); !ok || why != "" {
			return fmt.Errorf("%s, a well-known type of Google's, unlike Google's (%s): the well-known types are Google's own, imported from google/protobuf/*.proto", e.FullName(), why)
		}
	}
	for i := 0; i < ms.Len(); i++ {
		m := ms.Get(i)
		if g, err := protoregistry.GlobalFiles.FindDescriptorByName(m.FullName()); err == nil {
			gm, ok := g.(protoreflect.MessageDescriptor)
			why := "not a message"
			if ok {
				why = sameShape(m, gm)
			}
			if why != "" {
				return fmt.Errorf("%s, a well-known type of Google's, unlike Google's (%s): the well-known types are Google's own, imported from google/protobuf/*.proto", m.FullName(), why)
			}
		}
		if err := declarations(m.Messages(), m.Enums()); err != nil {
			return err
		}
	}
	return nil
}

// sameShape says how message m's fields differ from Google's g ("" if
// they do not): the numbers, names, kinds, cardinalities, oneofs and
// types that protojson relies on.
func sameShape(m, g protoreflect.MessageDescriptor) string {
	mf, gf := m.Fields(), g.Fields()
	if mf.Len() != gf.Len() {
		return fmt.Sprintf("%d fields, Google's %d", mf.Len(), gf.Len())
	}
	for i := 0; i < gf.Len(); i++ {
		want := gf.Get(i)
		got := mf.ByNumber(want.Number())
		if got == nil {
			return fmt.Sprintf("no field %d, Google's %s", want.Number(), want.Name())
		}
		if got.Name() != want.Name() || got.Kind() != want.Kind() || got.Cardinality() != want.Cardinality() || got.IsMap() != want.IsMap() ||
			oneofName(got) != oneofName(want) || typeName(got) != typeName(want) {
			return fmt.Sprintf("field %d is %s, Google's %s", want.Number(), fieldShape(got), fieldShape(want))
		}
	}
	return ""
}

// sameEnum says how enum e's values differ from Google's g ("" if they
// do not).
func sameEnum(e, g protoreflect.EnumDescriptor) string {
	if g == nil {
		return "not an enum"
	}
	ev, gv := e.Values(), g.Values()
	if ev.Len() != gv.Len() {
		return fmt.Sprintf("%d values, Google's %d", ev.Len(), gv.Len())
	}
	for i := 0; i < gv.Len(); i++ {
		if v := ev.ByNumber(gv.Get(i).Number()); v == nil || v.Name() != gv.Get(i).Name() {
			return fmt.Sprintf("no value %s = %d", gv.Get(i).Name(), gv.Get(i).Number())
		}
	}
	return ""
}

// fieldShape is a field as sameShape compares it, for its error.
func fieldShape(f protoreflect.FieldDescriptor) string {
	s := fmt.Sprintf("%s %s %s", f.Cardinality(), f.Kind(), f.Name())
	if t := typeName(f); t != "" {
		s += " of " + string(t)
	}
	if o := oneofName(f); o != "" {
		s += " in oneof " + string(o)
	}
	return s
}

// oneofName is the name of the (real) oneof that f is in; "" if none.
func oneofName(f protoreflect.FieldDescriptor) protoreflect.Name {
	if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
		return o.Name()
	}
	return ""
}

// typeName is the full name of f's message or enum type; "" for a scalar.
func typeName(f protoreflect.FieldDescriptor) protoreflect.FullName {
	switch {
	case f.Message() != nil:
		return f.Message().FullName()
	case f.Enum() != nil:
		return f.Enum().FullName()
	}
	return ""
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
