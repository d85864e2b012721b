package config

import (
	"net"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
	"github.com/walrelay/walrelay/internal/testkit/tlstest"
)

// TestRegistryTLS (a real Apicurio Registry: WALRELAY_TEST_REGISTRY=1,
// behind a TLS proxy that asks for a client certificate of its CA):
// kafka.schema_registry.tls_ca_file, tls_cert_file and tls_key_file reach
// it; without the CA the server is not trusted, without the certificate
// the handshake fails; the password is in no error.
func TestRegistryTLS(t *testing.T) {
	reg := registrytest.Start(t)
	certs, err := tlstest.New(t.TempDir(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	up, err := url.Parse(reg.Base())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(up))
	srv.TLS = certs.ServerConfig(true)
	srv.Config.ErrorLog = nil
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n  value_format: registry_passthrough\n  schema_registry:\n    url: https://127.0.0.1:" + port + registrytest.CCompatPath + "\n    username: u\n    password: hunter2\n"
	for _, c := range []struct {
		name, yaml, want string
	}{
		{"ca and client certificate", "    tls_ca_file: " + certs.CAFile + "\n    tls_cert_file: " + certs.ClientCert + "\n    tls_key_file: " + certs.ClientKey + "\n", ""},
		{"no CA", "    tls_cert_file: " + certs.ClientCert + "\n    tls_key_file: " + certs.ClientKey + "\n", "certificate signed by unknown authority"},
		{"no client certificate", "    tls_ca_file: " + certs.CAFile + "\n", "certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := load(t, base+c.yaml)
			if err != nil {
				t.Fatal(err)
			}
			r, err := Registry(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = r.Ping(t.Context())
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("ping: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("ping: %v, want %q", err, c.want)
			case err != nil && strings.Contains(err.Error(), "hunter2"):
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// TestRegistryOfSchemaFirst: a schema-first value format has its registry
// watched (walrelay status, the log, walrelay_schema_registry_requests_total)
// as the avro and registry_passthrough formats have.
func TestRegistryOfSchemaFirst(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n  brokers: [a:9092]\n  value_format: registered_avro\n  schema_registry:\n    url: http://r:8080/apis/ccompat/v7\n"
	for _, c := range []struct{ name, yaml string }{
		{"value registered_avro", ""},
		{"key avro, value registered_avro", "  key_format: avro\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := load(t, base+c.yaml)
			if err != nil {
				t.Fatal(err)
			}
			sc, err := SinkConfig(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if RegistryOf(sc) == nil {
				t.Fatal("RegistryOf: no registry for a schema-first value format")
			}
			// One client for both formats: the watch sees every request.
			if RegistryOf(sc) != sc.SchemaFirst.Registry() {
				t.Error("the schema-first format has a registry client of its own, unwatched")
			}
		})
	}
}
