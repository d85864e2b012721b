package schemafirst

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// TestRegistrySchemaFirstReferenceOutage (a real Apicurio Registry:
// WALRELAY_TEST_REGISTRY=1): a Protobuf schema that imports another is
// written with the referenced file read from the registry; while the
// registry fails (503) to give the referenced schema, the value is an
// outage (held and retried), not ErrNotRegistered (dead-lettered); once
// it answers, the value is written. A reference to a subject the
// registry lacks is ErrNotRegistered.
func TestRegistrySchemaFirstReferenceOutage(t *testing.T) {
	r := registrytest.Start(t)
	reg := mustRegistry(t, registry.Config{URL: r.URL()})
	register(t, reg.Client(), "shop-common-money", sr.Schema{Schema: "syntax = \"proto3\";\npackage shop.common;\nmessage Money { string currency = 1; int64 units = 2; }\n", Type: sr.TypeProtobuf})
	order := "syntax = \"proto3\";\npackage shop;\nimport \"shop/common/money.proto\";\nmessage OrderPaid { int64 id = 1; shop.common.Money total = 2; }\n"
	register(t, reg.Client(), "OrderPaid", sr.Schema{Schema: order, Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/common/money.proto", Subject: "shop-common-money", Version: 1}}})
	target, err := url.Parse(r.Base())
	if err != nil {
		t.Fatal(err)
	}
	var failRefs atomic.Bool
	failRefs.Store(true)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if failRefs.Load() && strings.Contains(req.URL.Path, "/subjects/shop-common-money/") {
			http.Error(w, `{"error_code": 50301, "message": "unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	enc := schemaFirst(t, srv.URL+registrytest.CCompatPath, Config{Kind: KindProtobuf})
	payload := []byte(`{"id": "1", "total": {"currency": "EUR", "units": "5"}}`)
	_, err = enc.Value(t.Context(), "orders", "OrderPaid", payload, 0)
	if err == nil || errors.Is(err, registry.ErrNotRegistered) || errors.Is(err, ErrMismatch) || errors.Is(err, registry.ErrUnauthorized) {
		t.Fatalf("the referenced schema unavailable: %v, want an outage (not ErrNotRegistered, ErrMismatch, ErrUnauthorized)", err)
	}
	failRefs.Store(false)
	if _, err := enc.Value(t.Context(), "orders", "OrderPaid", payload, 0); err != nil {
		t.Fatalf("the registry answering again: %v", err)
	}

	register(t, reg.Client(), "OrderLost", sr.Schema{Schema: strings.ReplaceAll(order, "OrderPaid", "OrderLost"), Type: sr.TypeProtobuf,
		References: []sr.SchemaReference{{Name: "shop/common/money.proto", Subject: "shop-common-money", Version: 1}}})
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, "/subjects/shop-common-money/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code": 40401, "message": "Subject not found"}`))
			return
		}
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(srv2.Close)
	enc2 := schemaFirst(t, srv2.URL+registrytest.CCompatPath, Config{Kind: KindProtobuf})
	if _, err := enc2.Value(t.Context(), "orders", "OrderLost", payload, 0); !errors.Is(err, registry.ErrNotRegistered) {
		t.Errorf("a reference the registry lacks: %v, want ErrNotRegistered", err)
	}
}

// subjectsServer is a registry that answers GET /subjects/S/versions/V
// (any version) with schemas[S], a Protobuf schema, and its references
// (refs[S]: import path to subject, version 1); else Confluent's 40401.
func subjectsServer(t *testing.T, schemas map[string]string, refs map[string]map[string]string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		if len(parts) == 4 && parts[0] == "subjects" && parts[2] == "versions" {
			if text, ok := schemas[parts[1]]; ok {
				rs := []map[string]any{}
				for name, subject := range refs[parts[1]] {
					rs = append(rs, map[string]any{"name": name, "subject": subject, "version": 1})
				}
				b, _ := json.Marshal(map[string]any{"subject": parts[1], "version": 1, "id": 7, "schemaType": "PROTOBUF", "schema": text, "references": rs})
				_, _ = w.Write(b)
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error_code": 40401, "message": "Subject not found"}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSchemaFirstProtobufWellKnownTypesAreGoogles (from review44's
// TestProbe44CraftedRegistryAnswers): a registry's schema that declared a
// well-known type of its own (package google.protobuf, message Duration
// { bool seconds = 1; }), or a reference that replaced
// google/protobuf/timestamp.proto, made protojson panic in
// registered_protobuf's writer, and nothing recovered: walrelay exited,
// and again at every restart on the event. Before the fix:
//
//	0s: 0 bytes, err PANIC: proto: google.protobuf.Timestamp.seconds: assigning invalid type int64
//	0s: 0 bytes, err PANIC: proto: google.protobuf.Duration.seconds: assigning invalid type int64
//
// (and here: a reference shadow.proto declaring Timestamp the same
// panic; a Value without Google's oneof kind "PANIC: runtime error:
// invalid memory address or nil pointer dereference").
// The well-known types are Google's own: a reference under their import
// path is not read (Confluent's serializers register Google's files as
// references of that name: they still work), and a schema declaring one
// of their names with other fields is refused (ErrNotRegistered:
// dead-lettered schema_refused); a copy of Google's own is taken.
func TestSchemaFirstProtobufWellKnownTypesAreGoogles(t *testing.T) {
	const (
		usesTimestamp = "syntax = \"proto3\";\nimport \"google/protobuf/timestamp.proto\";\nmessage E { google.protobuf.Timestamp t = 1; }\n"
		fakeTimestamp = "syntax = \"proto3\";\npackage google.protobuf;\nmessage Timestamp { string seconds = 1; }\n"
		realTimestamp = "syntax = \"proto3\";\npackage google.protobuf;\nmessage Timestamp { int64 seconds = 1; int32 nanos = 2; }\n"
	)
	url := subjectsServer(t, map[string]string{
		"shadowed":   usesTimestamp,
		"googles":    usesTimestamp,
		"T":          fakeTimestamp,
		"RealT":      realTimestamp,
		"declares":   "syntax = \"proto3\";\npackage google.protobuf;\nmessage E { Duration d = 1; }\nmessage Duration { bool seconds = 1; }\n",
		"imports":    "syntax = \"proto3\";\nimport \"shadow.proto\";\nmessage E { google.protobuf.Timestamp t = 1; }\n",
		"value-kind": "syntax = \"proto3\";\npackage google.protobuf;\nmessage Value { oneof other { bool bool_value = 4; } }\n",
		"copy":       "syntax = \"proto3\";\npackage google.protobuf;\nmessage Duration { int64 seconds = 1; int32 nanos = 2; }\n",
	}, map[string]map[string]string{
		"shadowed": {"google/protobuf/timestamp.proto": "T"},
		"googles":  {"google/protobuf/timestamp.proto": "RealT"},
		"imports":  {"shadow.proto": "T"},
	})
	for _, c := range []struct {
		subject, payload string
		want             string // the written message in JSON (timestamppb's, durationpb's); "" for refused
		refused          string
	}{
		{"shadowed", `{"t": "2020-01-01T00:00:00Z"}`, `{"t": "2020-01-01T00:00:00Z"}`, ""},
		{"googles", `{"t": "2020-01-01T00:00:00Z"}`, `{"t": "2020-01-01T00:00:00Z"}`, ""},
		{"declares", `{"d": "1s"}`, "", "google.protobuf.Duration"},
		{"imports", `{"t": "2020-01-01T00:00:00Z"}`, "", "shadow.proto declares google.protobuf.Timestamp"},
		{"value-kind", `{"bool_value": true}`, "", "google.protobuf.Value"},
		{"copy", `"90s"`, `"90s"`, ""},
	} {
		enc := schemaFirst(t, url, Config{Kind: KindProtobuf, Strategy: registry.StrategySubject, Subject: c.subject})
		var v []byte
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("PANIC: %v", p)
				}
			}()
			v, err = enc.Value(t.Context(), "orders", "E", []byte(c.payload), 1<<20)
		}()
		t.Logf("%s: %d bytes, %v", c.subject, len(v), err)
		if c.refused != "" {
			if !errors.Is(err, registry.ErrNotRegistered) || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("%s: %v, want ErrNotRegistered naming %s", c.subject, err, c.refused)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.subject, err)
			continue
		}
		_, body, err := registry.Unframe(v)
		if err != nil || len(body) == 0 || body[0] != 0 {
			t.Fatalf("%s: % x %v", c.subject, v, err)
		}
		fd, err := CompileProtobuf(t.Context(), "syntax = \"proto3\";\nimport \"google/protobuf/timestamp.proto\";\nmessage E { google.protobuf.Timestamp t = 1; }\n", nil)
		if err != nil {
			t.Fatal(err)
		}
		var m proto.Message = dynamicpb.NewMessage(fd.Messages().Get(0))
		if c.subject == "copy" {
			m = &durationpb.Duration{}
		}
		if err := proto.Unmarshal(body[1:], m); err != nil {
			t.Fatalf("%s: %v", c.subject, err)
		}
		if js, err := protojson.Marshal(m); err != nil || !jsonEqual(t, string(js), c.want) {
			t.Errorf("%s: wrote %s (%v), want %s", c.subject, js, err, c.want)
		}
	}
}

// TestProtobufWriterPanicIsAMismatch: behind CompileProtobuf's refusal, a
// message that makes Go's protobuf panic (a Duration of other fields,
// compiled here without the check) is the payload's mismatch, blaming the
// schema, not a panic that stops walrelay.
func TestProtobufWriterPanicIsAMismatch(t *testing.T) {
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{
		"d.proto": "syntax = \"proto3\";\npackage google.protobuf;\nmessage E { Duration d = 1; }\nmessage Duration { bool seconds = 1; }\n",
	})})}
	files, err := c.Compile(t.Context(), "d.proto")
	if err != nil {
		t.Fatal(err)
	}
	w := protobufWriter(files[0].Messages().Get(0), func(field, reason string) *MismatchError {
		return &MismatchError{Subject: "E", Version: 1, Field: field, Reason: reason}
	})
	out, me := w(nil, []byte(`{"d": "1s"}`))
	if me == nil || !errors.Is(me, ErrMismatch) || !strings.Contains(me.Reason, "the schema is at fault") || out != nil {
		t.Errorf("% x %v, want a mismatch blaming the schema", out, me)
	}
}
