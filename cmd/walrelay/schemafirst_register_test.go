package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/outbox"
	"github.com/walrelay/walrelay/sink"
)

const (
	createdAvro = `{"type":"record","name":"OrderCreated","namespace":"shop","fields":[{"name":"id","type":"long"}]}`
	knownAvro   = `{"type":"record","name":"Known","namespace":"shop","fields":[{"name":"id","type":"long"}]}`
	// knownBreaking adds a field without a default: BACKWARD refuses it.
	knownBreaking = `{"type":"record","name":"Known","namespace":"shop","fields":[{"name":"id","type":"long"},{"name":"qty","type":"int"}]}`
)

// schemaFile writes a schema into dir and returns its path.
func schemaFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRegistrySchemaFirstRegistersAtStart (WALRELAY_TEST_REGISTRY=1):
// with kafka.schema_registry.auto_register and schema files named in
// kafka.schema_registry.subjects, walrelay registers them at start,
// before it streams: while the registry does not answer it holds (no
// event published, nothing registered, the log says the registry is not
// answering), then registers the new subject's version 1 (and nothing new
// for a file already registered) and publishes with its id; a file that
// the subject's compatibility rule refuses (HTTP 409) stops the start
// with an error naming the subject, and registers nothing.
func TestRegistrySchemaFirstRegistersAtStart(t *testing.T) {
	reg := registrytest.Start(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	created, known := schemaFile(t, dir, "created.avsc", createdAvro), schemaFile(t, dir, "known.avsc", knownAvro)
	knownSS, err := cl.CreateSchema(t.Context(), "Known", sr.Schema{Type: sr.TypeAvro, Schema: knownAvro})
	if err != nil {
		t.Fatal(err)
	}
	px := reg.Proxy(t)
	px.Down()
	pg, kc, col := setup(t)
	conn := connect(t, pg.DSN)
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "registered_avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", "http://"+px.Addr()+registrytest.CCompatPath, "WALRELAY_KAFKA_SCHEMA_REGISTRY_TIMEOUT", "2s",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECTS", "OrderCreated="+created+",Known="+known)
	p := start(t, e, "run")
	p.waitLog("schema registry is not answering", 30*time.Second)
	id := outbox.NewID()
	if _, err := conn.Exec(t.Context(), "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'a', 'OrderCreated', '{\"id\": 7}')", id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if n := len(col.Records()); n != 0 || strings.Contains(p.out.String(), "msg=streaming") {
		t.Fatalf("%d records, streaming %v, while the registry was down and the schemas unregistered", n, strings.Contains(p.out.String(), "msg=streaming"))
	}
	if subjects, _ := cl.Subjects(t.Context()); len(subjects) != 1 {
		t.Fatalf("subjects %v while the registry was down", subjects)
	}
	px.Up()
	p.waitLog("msg=streaming", time.Minute)
	waitAll(t, col, []string{id}, time.Minute)
	ss, err := cl.SchemaByVersion(t.Context(), "OrderCreated", -1)
	if err != nil || ss.Version != 1 {
		t.Fatalf("OrderCreated: %+v %v, want version 1 registered by walrelay", ss, err)
	}
	for _, r := range col.Records() {
		if sink.Header(r, "id") == id {
			if sid := int(r.Value[1])<<24 | int(r.Value[2])<<16 | int(r.Value[3])<<8 | int(r.Value[4]); sid != ss.ID {
				t.Errorf("schema id %d, want %d (OrderCreated version 1)", sid, ss.ID)
			}
		}
	}
	if vs, _ := cl.SubjectVersions(t.Context(), "Known"); len(vs) != 1 {
		t.Errorf("Known versions %v, want [1]: its file is registered already", vs)
	}
	if !strings.Contains(p.out.String(), "subject=OrderCreated") {
		t.Errorf("no log line of OrderCreated's registration")
	}
	p.signal(syscall.SIGTERM)
	p.exit(30 * time.Second)

	// An incompatible file: the start stops, naming the subject.
	if c := cl.SetCompatibility(t.Context(), sr.SetCompatibility{Level: sr.CompatBackward}, "Known"); c[0].Err != nil {
		t.Fatal(c[0].Err)
	}
	breaking := schemaFile(t, dir, "known2.avsc", knownBreaking)
	p2 := start(t, e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL(), "WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECTS", "Known="+breaking), "run")
	if code := p2.exit(time.Minute); code == 0 {
		t.Fatalf("walrelay started with a schema the registry refuses:\n%s", p2.out.String())
	}
	if l := lastLine(p2.out.String()); !strings.Contains(l, "Known") || !strings.Contains(l, "incompatible") || !strings.Contains(l, breaking) {
		t.Errorf("the error %q does not name the subject Known, its file and incompatibility", l)
	}
	if vs, _ := cl.SubjectVersions(t.Context(), "Known"); len(vs) != 1 || knownSS.Version != 1 {
		t.Errorf("Known versions %v, want [1]", vs)
	}
}

// TestRegistrySchemaFirstCheckRegistration (WALRELAY_TEST_REGISTRY=1):
// walrelay check with auto_register and schema files says what the start
// would register: a new subject's version 1, nothing for a file
// registered already, FAIL for a file the subject's compatibility rule
// refuses; it registers nothing and prints no secret. With auto_register
// false, a file not registered is a warning that walrelay will not
// register it.
func TestRegistrySchemaFirstCheckRegistration(t *testing.T) {
	reg := registrytest.Start(t)
	pg, kc, _ := setup(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := cl.CreateSchema(t.Context(), "Known", sr.Schema{Type: sr.TypeAvro, Schema: knownAvro}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateSchema(t.Context(), "Strict", sr.Schema{Type: sr.TypeAvro, Schema: strings.ReplaceAll(knownAvro, "Known", "Strict")}); err != nil {
		t.Fatal(err)
	}
	if c := cl.SetCompatibility(t.Context(), sr.SetCompatibility{Level: sr.CompatBackward}, "Strict"); c[0].Err != nil {
		t.Fatal(c[0].Err)
	}
	subjects := "New=" + schemaFile(t, dir, "new.avsc", createdAvro) + ",Known=" + schemaFile(t, dir, "known.avsc", knownAvro) +
		",Strict=" + schemaFile(t, dir, "strict.avsc", strings.ReplaceAll(knownBreaking, "Known", "Strict"))
	e := baseEnv(pg, kc).with("WALRELAY_KAFKA_VALUE_FORMAT", "registered_avro", "WALRELAY_KAFKA_SCHEMA_REGISTRY_URL", reg.URL(),
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_USERNAME", "relay", "WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD", "pw-never-printed",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_SUBJECTS", subjects)
	code, out := runCmd(t, e.with("WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER", "true"), "check")
	if l := subjectCheckLine(out, "schema subject New"); !strings.HasPrefix(l, "OK") || !strings.Contains(l, "would register") || !strings.Contains(l, "version 1 of a new subject") {
		t.Errorf("New: %q", l)
	}
	if l := subjectCheckLine(out, "schema subject Known"); !strings.HasPrefix(l, "OK") || !strings.Contains(l, "registered already") {
		t.Errorf("Known: %q", l)
	}
	if l := subjectCheckLine(out, "schema subject Strict"); !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "incompatible") {
		t.Errorf("Strict: %q", l)
	}
	if code == 0 {
		t.Errorf("check passed with a schema the registry would refuse:\n%s", out)
	}
	if strings.Contains(out, "pw-never-printed") {
		t.Errorf("check printed the registry's password:\n%s", out)
	}
	if got, _ := cl.Subjects(t.Context()); len(got) != 2 {
		t.Errorf("subjects %v after check: check registered", got)
	}
	_, out = runCmd(t, e, "check")
	if l := subjectCheckLine(out, "schema subject New"); !strings.Contains(l, "auto_register") {
		t.Errorf("New without auto_register: %q", l)
	}
	if l := subjectCheckLine(out, "schema subject Known"); !strings.HasPrefix(l, "OK") {
		t.Errorf("Known without auto_register: %q", l)
	}
}
