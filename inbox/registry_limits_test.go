package inbox

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
)

// TestRegistryDecodeHostileAvroUndecodable: one Kafka record whose
// registry schema lets a few bytes say gigabytes (an array of null with a
// block count of 2^40, a fixed of 2^31-1 bytes) or nest without end (a
// recursive record and 1 MiB of 0x02) is ErrUndecodable (dead-lettered),
// into any target, instead of a fatal out-of-memory or stack overflow that
// kills the consumer again after every restart, or that hamba/avro
// would build into hundreds of MiB (an array of 1 MiB of records of one
// int: 359 MiB; 2^20 empty records, 5 bytes: 63 MiB); and a 2 MiB string, as
// walrelay's avro format writes it, decodes.
func TestRegistryDecodeHostileAvroUndecodable(t *testing.T) {
	t.Parallel()
	type rec struct {
		R any `avro:"r"`
	}
	cases := []struct {
		name, schema string
		body         []byte
		ok           bool
	}{
		{"array of null, 2^40", `{"type":"array","items":"null"}`, append(binary.AppendVarint(nil, 1<<40), 0), false},
		{"recursive record, 1 MiB", `{"type":"record","name":"R","fields":[{"name":"r","type":["null","R"]}]}`, bytes.Repeat([]byte{2}, 1<<20), false},
		{"fixed of 2^31-1", `{"type":"record","name":"R","fields":[{"name":"r","type":{"type":"fixed","name":"F","size":2147483647}}]}`, []byte{0}, false},
		{"1 MiB of records of one int", `{"type":"array","items":{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}}`, append(append(binary.AppendVarint(nil, 1<<20-16), bytes.Repeat([]byte{2}, 1<<20-16)...), 0), false},
		{"2^20 empty records in 5 bytes", `{"type":"array","items":{"type":"record","name":"E","fields":[]}}`, append(binary.AppendVarint(nil, 1<<20), 0), false},
		{"string of 2 MiB", `{"type":"record","name":"R","fields":[{"name":"r","type":"string"}]}`, append(binary.AppendVarint(nil, 2<<20), strings.Repeat("a", 2<<20)...), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				b, _ := json.Marshal(map[string]any{"schema": c.schema})
				_, _ = w.Write(b)
			}))
			defer srv.Close()
			reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			framed := registry.Frame(nil, 1, c.body)
			var a any
			var m map[string]any
			var r rec
			for _, v := range []any{&a, &m, &r} {
				err := reg.Decode(t.Context(), framed, v)
				if c.ok && err != nil {
					t.Errorf("into %T: %v", v, err)
				}
				if !c.ok && !errors.Is(err, ErrUndecodable) {
					t.Errorf("into %T: %v, want ErrUndecodable", v, err)
				}
			}
		})
	}
}

// TestNewRegistryRefusesCredentialsInURL: credentials in the URL
// (franz-go's errors print the URL, password and all) are refused,
// naming Username and Password, and the refusal does not print them.
func TestNewRegistryRefusesCredentialsInURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://u:s3cret-pw@registry:8081", "http://s3cret-pw@registry:8081", "http://u:s3cret-pw@registry:8081/%zz"} {
		_, err := NewRegistry(RegistryConfig{URL: u})
		if err == nil || !strings.Contains(err.Error(), "Username") && !strings.Contains(err.Error(), "not a URL") {
			t.Errorf("NewRegistry(%q): %v, want a refusal naming Username and Password", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("NewRegistry(%q): the error prints the password: %v", u, err)
		}
	}
	if _, err := NewRegistry(RegistryConfig{URL: "http://registry:8081/apis/ccompat/v7", Username: "u", Password: "pw"}); err != nil {
		t.Errorf("a URL without credentials: %v", err)
	}
}

// TestNewRegistryRefusesQueryInURL: a token in the URL's query or fragment
// (?access_token=...) passed, franz-go kept it on every request, and its
// errors printed it (review44): it is refused, naming Username, Password
// and TLS, without printing it.
func TestNewRegistryRefusesQueryInURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://127.0.0.1:1/?access_token=s3cret-pw", "http://registry:8081/apis/ccompat/v7?token=s3cret-pw", "http://registry:8081#s3cret-pw"} {
		reg, err := NewRegistry(RegistryConfig{URL: u, Timeout: time.Second})
		if err == nil {
			var v any
			err = reg.Decode(t.Context(), registry.Frame(nil, 1, []byte{2}), &v)
			t.Errorf("NewRegistry(%q) taken (a decode: %v), want a refusal", u, err)
			continue
		}
		if !strings.Contains(err.Error(), "query or fragment") || !strings.Contains(err.Error(), "RegistryConfig.TLS") {
			t.Errorf("NewRegistry(%q): %v, want a refusal naming the query, Username, Password and TLS", u, err)
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("NewRegistry(%q): the error prints the token: %v", u, err)
		}
	}
}

// TestNewRegistryURLWithoutScheme: a URL that is not http or https with a
// host is refused without printing it: "user:s3cret-pw@127.0.0.1:1" (a
// host:port with credentials, no scheme) parses as the scheme "user" and
// no User, was taken, and franz-go, putting http:// in front of it,
// printed the password in every error of the registry (the review's
// TestProbeNewRegistryCredentialsWithoutScheme). As walrelay's own
// kafka.schema_registry.url is checked (config/security.go).
func TestNewRegistryURLWithoutScheme(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"user:s3cret-pw@127.0.0.1:1", "http:/user:s3cret-pw@127.0.0.1:1", "registry:8081", "ftp://registry:8081", "http://", "//s3cret-pw@registry:8081"} {
		reg, err := NewRegistry(RegistryConfig{URL: u, Timeout: time.Second})
		if err == nil {
			var v any
			err = reg.Decode(t.Context(), registry.Frame(nil, 1, []byte{2}), &v)
			t.Errorf("NewRegistry(%q) taken (a decode: %v), want a refusal: not an http or https URL with a host", u, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("NewRegistry(%q): the refusal prints the password: %v", u, err)
		}
	}
}

// TestRegistryMaxDecodedBytes: RegistryConfig.MaxDecodedBytes bounds
// what an Avro value may cost decoded: an array of 40,000 records of one
// int (40 KB, some 16 MiB decoded) is undecodable within 8 MiB, and
// decodes by default; a negative bound is refused.
func TestRegistryMaxDecodedBytes(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schema": `{"type":"array","items":{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}}`})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	const n = 40_000
	framed := registry.Frame(nil, 1, append(append(binary.AppendVarint(nil, n), bytes.Repeat([]byte{2}, n)...), 0))
	for _, c := range []struct {
		max int
		ok  bool
	}{{0, true}, {8 << 20, false}, {64 << 20, true}} {
		reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second, MaxDecodedBytes: c.max})
		if err != nil {
			t.Fatal(err)
		}
		var v any
		err = reg.Decode(t.Context(), framed, &v)
		if c.ok && (err != nil || len(v.([]any)) != n) {
			t.Errorf("MaxDecodedBytes %d: %v", c.max, err)
		}
		if !c.ok && (!errors.Is(err, ErrUndecodable) || !errors.Is(err, format.ErrAvroLimit)) {
			t.Errorf("MaxDecodedBytes %d: %v, want ErrUndecodable (ErrAvroLimit)", c.max, err)
		}
		_, err = reg.Decoded(t.Context(), framed)
		if c.ok != (err == nil) {
			t.Errorf("MaxDecodedBytes %d: Decoded: %v", c.max, err)
		}
	}
	if _, err := NewRegistry(RegistryConfig{URL: srv.URL, MaxDecodedBytes: -1}); err == nil {
		t.Error("NewRegistry with a negative MaxDecodedBytes: no error")
	}
}
