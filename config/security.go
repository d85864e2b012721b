package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/format/schemafirst"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/sink/record"
)

// readSecrets reads the secret files of the configuration. The PostgreSQL
// password goes to PGPASSWORD of this process, which every connection that
// walrelay opens reads when its DSN has no password.
func (c *Config) readSecrets() error {
	if f := c.Postgres.PasswordFile; f != "" {
		if dsnHasPassword(c.Postgres.DSN) {
			return errors.New("postgres.password_file is set and postgres.dsn gives a password too (written in it, or from its passfile or service file): keep one")
		}
		pw, err := readSecret("postgres.password_file", f)
		if err != nil {
			return err
		}
		if err := os.Setenv("PGPASSWORD", pw); err != nil {
			return fmt.Errorf("postgres.password_file: %w", err)
		}
		c.pgPassword = pw
	}
	if err := passwordFile("kafka.sasl.password", c.Kafka.SASL.PasswordFile, &c.Kafka.SASL.Password); err != nil {
		return err
	}
	return passwordFile("kafka.schema_registry.password", c.Kafka.SchemaRegistry.PasswordFile, &c.Kafka.SchemaRegistry.Password)
}

// passwordFile reads the password of the key key+"_file", the file path
// (none if empty), into *pw, the password of the key key, which must not be
// set as well.
func passwordFile(key, path string, pw *string) error {
	if path == "" {
		return nil
	}
	if *pw != "" {
		return fmt.Errorf("%s_file and %s are both set: keep one", key, key)
	}
	s, err := readSecret(key+"_file", path)
	if err != nil {
		return err
	}
	*pw = s
	return nil
}

// readSecret reads a one-line secret file; a final newline is not part of
// the secret.
func readSecret(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", key, path)
	}
	return s, nil
}

// Secrets lists the configuration's passwords as parsed (the one pgconn
// finds for the DSN, the password file's, the SASL password, the schema
// registry's), for
// ScrubError.
func (c *Config) Secrets() []string {
	var out []string
	for _, s := range []string{dsnPassword(c.Postgres.DSN), c.pgPassword, c.Kafka.SASL.Password, c.Kafka.SchemaRegistry.Password} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func redactSecret(s string) string {
	if s == "" {
		return ""
	}
	return "redacted"
}

// kafkaSecurity returns the client options for the brokers' TLS and SASL.
func kafkaSecurity(cfg *Config) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	t := cfg.Kafka.TLS
	if t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
		if t.CAFile != "" {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("kafka.tls.ca_file: no PEM certificate in %s", t.CAFile)
			}
		}
		switch {
		case t.CertFile != "" && t.KeyFile != "":
			cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.cert_file and kafka.tls.key_file: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		case t.CertFile != "":
			return nil, errors.New("kafka.tls.cert_file is set without kafka.tls.key_file")
		case t.KeyFile != "":
			return nil, errors.New("kafka.tls.key_file is set without kafka.tls.cert_file")
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	s := cfg.Kafka.SASL
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" {
			return nil, errors.New("kafka.sasl.username or password is set without kafka.sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return opts, nil
	}
	if s.Username == "" || s.Password == "" {
		return nil, fmt.Errorf("kafka.sasl.mechanism %s needs kafka.sasl.username and a password (kafka.sasl.password_file, %s or kafka.sasl.password)",
			s.Mechanism, EnvName("kafka.sasl.password"))
	}
	switch strings.ToUpper(s.Mechanism) {
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("kafka.sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
	}
	return opts, nil
}

// checkSchemaRegistry checks the keys of the schema registry formats.
func (c *Config) checkSchemaRegistry() error {
	r := c.Kafka.SchemaRegistry
	if err := c.checkSchemaFirst(); err != nil {
		return err
	}
	avro := c.Kafka.KeyFormat == string(record.FormatAvro) || c.Kafka.ValueFormat == string(record.FormatAvro)
	switch {
	case avro && r.URL == "":
		return errors.New("kafka.key_format or kafka.value_format avro needs kafka.schema_registry.url")
	case c.Kafka.KeyFormat == string(record.FormatRegistryPassthrough):
		return errors.New("kafka.key_format registry_passthrough: values only (the key is the aggregate id's text)")
	case c.Kafka.ValueFormat == string(record.FormatRegistryPassthrough) && r.URL == "":
		return errors.New("kafka.value_format registry_passthrough needs kafka.schema_registry.url")
	case r.IDKind != "contentId":
		return fmt.Errorf("kafka.schema_registry.id_kind %q: want contentId (the id of Confluent's API; Apicurio's globalId is not supported)", r.IDKind)
	case r.Timeout <= 0:
		return fmt.Errorf("kafka.schema_registry.timeout %s: want a positive duration", r.Timeout)
	case (r.Password != "" || r.PasswordFile != "") && r.Username == "":
		return errors.New("kafka.schema_registry.password needs kafka.schema_registry.username")
	}
	if r.URL == "" {
		return nil
	}
	// The errors never print the URL: it may hold a password or a token.
	switch err := registry.CheckURL(r.URL); {
	case errors.Is(err, registry.ErrURLCredentials):
		return errors.New("kafka.schema_registry.url holds credentials (user@ or user:password@; a token as the user too), which errors and logs would print: give them in kafka.schema_registry.username and kafka.schema_registry.password or kafka.schema_registry.password_file")
	case errors.Is(err, registry.ErrURLQuery):
		return errors.New("kafka.schema_registry.url has a query or fragment (?... or #...; a token as ?access_token= too), which errors and logs would print: give credentials in kafka.schema_registry.username and kafka.schema_registry.password or kafka.schema_registry.password_file, or a TLS client certificate in kafka.schema_registry.tls_cert_file and kafka.schema_registry.tls_key_file")
	case err != nil:
		return errors.New("kafka.schema_registry.url: want an http or https URL with a host (http://host:port/path)")
	}
	return nil
}

// SinkConfig maps the configuration onto the sink's, security included;
// extra options (hooks) are the producer's.
func SinkConfig(cfg *Config, log *slog.Logger, extra ...kgo.Opt) (sink.Config, error) {
	sec, err := kafkaSecurity(cfg)
	if err != nil {
		return sink.Config{}, err
	}
	k := cfg.Kafka
	linger := k.Linger
	if linger == 0 {
		linger = -1 // the sink's zero is its default; walrelay's 0 is none
	}
	kf, err := record.ParseFormat(k.KeyFormat)
	if err != nil {
		return sink.Config{}, fmt.Errorf("kafka.key_format: %w", err)
	}
	var avro *format.AvroEncoder
	var pass *format.Passthrough
	var sf *schemafirst.Encoder
	vf, err := record.ParseFormat(k.ValueFormat)
	if err != nil {
		return sink.Config{}, fmt.Errorf("kafka.value_format: %w", err)
	}
	_, schemaFirst := vf.SchemaFirst()
	if kf == record.FormatAvro || vf == record.FormatAvro || vf == record.FormatRegistryPassthrough || schemaFirst {
		// One client for every registry format: its TLS, and one watch
		// (RegistryOf) that sees each request.
		reg, err := Registry(cfg)
		if err != nil {
			return sink.Config{}, err
		}
		avro = format.NewAvroEncoder(reg)
		if pass, err = passthroughOf(cfg, reg); err != nil {
			return sink.Config{}, err
		}
		if sf, err = schemaFirstOf(cfg, reg); err != nil {
			return sink.Config{}, err
		}
	}
	sc := sink.Config{
		Avro: avro, Passthrough: pass, SchemaFirst: sf,
		KeyFormat: kf, ValueFormat: vf, ExpandJSONPayload: k.ExpandJSONPayload, RequestTimeout: k.RequestTimeout,
		Brokers: k.Brokers, ClientID: k.ClientID, Topic: k.Topic, DLQTopic: k.DLQTopic,
		TopicRegex: k.TopicRegex, TombstoneOnEmpty: k.TombstoneOnEmpty,
		// The offsets topic is walrelay's own in either mode: a relay may
		// turn exactly-once on later, or another read it.
		AllowedTopics: k.AllowedTopics, ReservedTopics: []string{k.OffsetsTopic},
		Compression: k.Compression, Linger: linger, BatchMaxBytes: int32(min(k.BatchMaxBytes, 1<<30)),
		MaxBufferedRecords: k.MaxBufferedRecords, MaxBufferedBytes: k.MaxBufferedBytes,
		DisableAutoCreateTopics: !k.AutoCreateTopics, Logger: log,
		Opts: sec, ProducerOpts: extra,
	}
	for _, l := range cfg.OutboxConfig().Layouts() {
		sc.PlacedPartitions = sc.PlacedPartitions || l.PartitionColumn != ""
	}
	for _, t := range cfg.Outbox.Tables {
		if t.Topic != "" {
			if sc.Routes == nil {
				sc.Routes = map[string]record.Route{}
			}
			schema, name, _ := splitTable(t.Table)
			sc.Routes[schema+"."+name] = record.Route{Topic: t.Topic, TopicRegex: t.TopicRegex}
		}
	}
	for _, h := range record.OptionalHeaders {
		if !slices.Contains(k.Headers, h) {
			sc.OmitHeaders = append(sc.OmitHeaders, h)
		}
	}
	if k.CloudEvents != "" {
		sc.CloudEvents, sc.CloudEventsSource = k.CloudEvents, k.CloudEventsSource
		if sc.CloudEventsSource == "" {
			sc.CloudEventsSource = "/{table}"
			if pc, err := pgconn.ParseConfig(cfg.Postgres.DSN); err == nil {
				sc.CloudEventsSource = "/" + pc.Database + sc.CloudEventsSource
			}
		}
	}
	if k.ExactlyOnce {
		// The key and the source, and the id by default, come from the
		// database (relay.Run).
		sc.Transactions = &sink.Transactions{ID: k.TransactionalID, Interval: k.TransactionInterval, Timeout: k.TransactionTimeout, Takeover: k.TakeoverID, AcceptTimeline: int32(k.AcceptTimeline), OffsetsTopic: k.OffsetsTopic}
	}
	return sc, nil
}
