package config

import (
	"strings"
	"testing"
)

// TestBrokersRefuseCredentials: a kafka.brokers entry is host:port; one
// with credentials (user:pw@host:9092, a token@host) or a URL
// (kafka://user:pw@host:9092) is refused at load, naming the entry and
// the SASL keys, not printing it: franz-go dials it as a host name and
// prints it, password and all, in every dial error.
func TestBrokersRefuseCredentials(t *testing.T) {
	base := "postgres:\n  dsn: postgres://u@h/db\nkafka:\n"
	for _, c := range []struct{ yaml, want string }{
		{"  brokers: [a:9092, 'u:hunter2@b:9092']\n", "kafka.brokers entry 2 holds credentials"},
		{"  brokers: ['hunter2@b:9092']\n", "kafka.brokers entry 1 holds credentials"},
		{"  brokers: ['kafka://u:hunter2@b:9092']\n", "kafka.brokers entry 1 holds credentials"},
		{"  brokers: ['kafka://hunter2.example:9092']\n", "kafka.brokers entry 1: want host:port"},
	} {
		_, err := load(t, base+c.yaml)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.yaml, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error shows the entry: %v", c.yaml, err)
		}
	}
	for _, ok := range []string{"  brokers: [a:9092, '[::1]:9092', b]\n"} {
		if _, err := load(t, base+ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}
