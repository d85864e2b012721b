package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/sink"
)

// Registry returns a client of the schema registry of
// kafka.schema_registry.*: its URL, basic auth, timeout and TLS
// (tls_ca_file, tls_cert_file and tls_key_file; the system's CAs without
// them).
func Registry(cfg *Config) (*registry.Client, error) {
	r := cfg.Kafka.SchemaRegistry
	tc, err := registryTLS(cfg)
	if err != nil {
		return nil, err
	}
	reg, err := registry.New(registry.Config{URL: r.URL, Username: r.Username, Password: r.Password, AutoRegister: r.AutoRegister, Timeout: r.Timeout, TLS: tc})
	if err != nil {
		return nil, fmt.Errorf("kafka.schema_registry.url: %w", err)
	}
	return reg, nil
}

// RegistryOf is the schema registry of a sink's registry formats, nil
// without one.
func RegistryOf(sc sink.Config) *registry.Client {
	switch {
	case sc.Avro != nil:
		return sc.Avro.Registry()
	case sc.Passthrough != nil:
		return sc.Passthrough.Registry()
	case sc.SchemaFirst != nil:
		return sc.SchemaFirst.Registry()
	}
	return nil
}

// registryTLS is the TLS configuration of the schema registry's https
// URL, nil for Go's defaults (the system's CAs, no client certificate).
func registryTLS(cfg *Config) (*tls.Config, error) {
	r := cfg.Kafka.SchemaRegistry
	if r.TLSCAFile == "" && r.TLSCertFile == "" && r.TLSKeyFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.TLSCAFile != "" {
		pem, err := os.ReadFile(r.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.schema_registry.tls_ca_file: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka.schema_registry.tls_ca_file: no PEM certificate in %s", r.TLSCAFile)
		}
	}
	switch {
	case r.TLSCertFile != "" && r.TLSKeyFile != "":
		cert, err := tls.LoadX509KeyPair(r.TLSCertFile, r.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.schema_registry.tls_cert_file and kafka.schema_registry.tls_key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case r.TLSCertFile != "":
		return nil, errors.New("kafka.schema_registry.tls_cert_file is set without kafka.schema_registry.tls_key_file")
	case r.TLSKeyFile != "":
		return nil, errors.New("kafka.schema_registry.tls_key_file is set without kafka.schema_registry.tls_cert_file")
	}
	return tc, nil
}
