package config

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/internal/testkit/tlstest"
)

// TestTrustChecks: a PostgreSQL host that is not local and is reached
// without sslmode=verify-full is warned of (the default prefer, disable,
// require, verify-ca), naming the host and not the password; a unix
// socket, a loopback host and verify-full are not. SASL PLAIN without TLS
// to a broker that is not local is warned of; with TLS, to loopback, or
// SCRAM, not. A route that lets a row choose the start of its topic is
// warned of unless kafka.allowed_topics is set. Profiles served beyond
// loopback are warned of.
func TestTrustChecks(t *testing.T) {
	t.Parallel()
	certs, err := tlstest.New(t.TempDir(), "db.example.com")
	if err != nil {
		t.Fatal(err)
	}
	const pw = "Sup3r-Secr3t"
	type want struct {
		name, detail string // detail: a part of it; "" with name: OK
	}
	for _, c := range []struct {
		what string
		set  func(*Config)
		want []want
	}{
		{"default sslmode (prefer)", func(c *Config) { c.Postgres.DSN = "host=db.example.com user=app password=" + pw + " dbname=shop" },
			[]want{{"postgres tls", "db.example.com: the connection may go without TLS"}}},
		{"a URL without sslmode", func(c *Config) { c.Postgres.DSN = "postgres://app:" + pw + "@db.example.com:5432/shop" },
			[]want{{"postgres tls", "sslmode=verify-full"}}},
		{"sslmode=disable", func(c *Config) { c.Postgres.DSN = "host=db.example.com sslmode=disable" },
			[]want{{"postgres tls", "may go without TLS"}}},
		{"sslmode=require", func(c *Config) { c.Postgres.DSN = "host=db.example.com sslmode=require" },
			[]want{{"postgres tls", "(sslmode=require)"}}},
		{"sslmode=verify-ca", func(c *Config) { c.Postgres.DSN = "host=db.example.com sslmode=verify-ca sslrootcert=" + certs.CAFile },
			[]want{{"postgres tls", "(sslmode=verify-ca)"}}},
		{"sslmode=verify-full", func(c *Config) {
			c.Postgres.DSN = "host=db.example.com sslmode=verify-full sslrootcert=" + certs.CAFile
		}, []want{{"postgres tls", ""}}},
		{"verify-full, several hosts", func(c *Config) {
			c.Postgres.DSN = "postgres://app@db-1.example.com,db-2.example.com/shop?sslmode=verify-full&target_session_attrs=read-write"
		}, []want{{"postgres tls", ""}}},
		{"one host of two not local, prefer", func(c *Config) { c.Postgres.DSN = "host=localhost,db-2.example.com dbname=shop" },
			[]want{{"postgres tls", "db-2.example.com: "}}},
		{"unix socket", func(c *Config) { c.Postgres.DSN = "host=/var/run/postgresql dbname=shop" }, []want{{"postgres tls", ""}}},
		{"localhost", func(c *Config) { c.Postgres.DSN = "postgres://app:" + pw + "@localhost/shop" }, []want{{"postgres tls", ""}}},
		{"127.0.0.1", func(c *Config) { c.Postgres.DSN = "host=127.0.0.1 sslmode=disable" }, []want{{"postgres tls", ""}}},
		{"::1", func(c *Config) { c.Postgres.DSN = "postgres://app@[::1]:5432/shop" }, []want{{"postgres tls", ""}}},

		{"SASL PLAIN without TLS", func(c *Config) {
			c.Kafka.Brokers, c.Kafka.SASL.Mechanism, c.Kafka.SASL.Username, c.Kafka.SASL.Password = []string{"127.0.0.1:9092", "kafka-1.example.com:9092"}, "PLAIN", "u", pw
		}, []want{{"kafka tls", "PLAIN without TLS sends the password in clear to kafka-1.example.com:9092"}}},
		{"SASL PLAIN over TLS", func(c *Config) {
			c.Kafka.Brokers, c.Kafka.SASL.Mechanism, c.Kafka.TLS.Enabled = []string{"kafka-1.example.com:9092"}, "plain", true
		}, []want{{"kafka tls", ""}}},
		{"SASL PLAIN to loopback", func(c *Config) {
			c.Kafka.Brokers, c.Kafka.SASL.Mechanism = []string{"127.0.0.1:9092", "localhost:9093"}, "PLAIN"
		}, []want{{"kafka tls", ""}}},
		{"SCRAM without TLS", func(c *Config) {
			c.Kafka.Brokers, c.Kafka.SASL.Mechanism = []string{"kafka-1.example.com:9092"}, "SCRAM-SHA-512"
		}, []want{{"kafka tls", ""}}},

		{"the default template", func(*Config) {}, []want{{"topic routing", ""}}},
		{"a template that starts with the aggregate type", func(c *Config) { c.Kafka.Topic = "{aggregatetype}" },
			[]want{{"topic routing", `kafka topic "{aggregatetype}" starts with a placeholder`}}},
		{"a regex route", func(c *Config) { c.Kafka.Topic, c.Kafka.TopicRegex = "outbox.$1", "(.*)" },
			[]want{{"topic routing", "kafka.allowed_topics"}}},
		{"a table's regex route", func(c *Config) {
			c.Outbox.Tables = []OutboxTable{{Table: "billing.events", Topic: "billing.$1", TopicRegex: "(.*)"}}
		}, []want{{"topic routing", "outbox.tables billing.events topic_regex"}}},
		{"profiles on every interface", func(c *Config) { c.Admin.Listen, c.Admin.Pprof = "0.0.0.0:8087", true },
			[]want{{"admin listener", "without authentication on 0.0.0.0:8087"}}},
		{"profiles on loopback", func(c *Config) { c.Admin.Pprof = true }, []want{{"admin listener", ""}}},
		{"a regex route confined", func(c *Config) {
			c.Kafka.Topic, c.Kafka.TopicRegex, c.Kafka.AllowedTopics = "outbox.$1", "(.*)", []string{"outbox.*"}
		}, []want{{"topic routing", ""}}},
	} {
		var cfg Config
		cfg.keys() // the defaults
		cfg.Postgres.DSN = "host=/tmp"
		c.set(&cfg)
		got := map[string]TrustCheck{}
		for _, tc := range cfg.TrustChecks() {
			got[tc.Name] = tc
			if strings.Contains(tc.Detail, pw) {
				t.Fatalf("%s: %s prints the password: %s", c.what, tc.Name, tc.Detail)
			}
		}
		for _, w := range c.want {
			tc, ok := got[w.name]
			switch {
			case !ok:
				t.Errorf("%s: no %s line", c.what, w.name)
			case w.detail == "" && !tc.OK:
				t.Errorf("%s: %s warns: %s", c.what, w.name, tc.Detail)
			case w.detail != "" && (tc.OK || !strings.Contains(tc.Detail, w.detail)):
				t.Errorf("%s: %s ok=%v %q, want a warning with %q", c.what, w.name, tc.OK, tc.Detail, w.detail)
			}
		}
	}
}
