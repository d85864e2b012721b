package inbox

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/walrelay/walrelay/format/registry"
)

// TestRegistryDecodesNamesJavaRefuses: the inbox only reads, so a
// registry's Avro schema with names that Java's Avro refuses (a field
// "first-name", an enum symbol "a-b", registered by a non-Java producer
// into a registry without validity rules) decodes as hamba/avro decodes
// it: the Java name check is for what walrelay writes (Debezium's
// consumers must read it), not for what it reads. Every such record was
// dead-lettered undecodable (the review's
// TestProbeRegistryJavaNameCheckDeadLettersDecodableRecords).
func TestRegistryDecodesNamesJavaRefuses(t *testing.T) {
	t.Parallel()
	schema := `{"type":"record","name":"Order","fields":[{"name":"first-name","type":"string"},{"name":"e","type":{"type":"enum","name":"E","symbols":["a-b"]}}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		b, _ := json.Marshal(map[string]any{"schema": schema, "schemaType": "AVRO"})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	reg, err := NewRegistry(RegistryConfig{URL: srv.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := reg.Decode(t.Context(), registry.Frame(nil, 1, []byte{6, 'a', 'd', 'a', 0}), &v); err != nil {
		t.Fatalf("a record of a registry schema with a field first-name (which hamba/avro decodes): %v; the record is dead-lettered, not handled", err)
	}
	if v["first-name"] != "ada" || v["e"] != "a-b" {
		t.Errorf("decoded %v, want first-name ada, e a-b", v)
	}
}
