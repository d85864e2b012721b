package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretShapesNeverPrinted: a password of every shape pgx accepts (or
// refuses) is printed by no command, in no output or error: walrelay
// config, check and run (its start line and its failed connection) over
// URL and key=value DSNs, quoted values with spaces and escaped quotes, @ #
// & % / in passwords, sslpassword, several hosts, a passfile and
// PGPASSWORD; and debezium import over the secrets of a connector and a
// worker. Each password is Sup3r, a separator and Secr3t: neither half may
// appear. No server is needed: the DSNs point at a closed port.
func TestSecretShapesNeverPrinted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	passfile := filepath.Join(dir, "pgpass")
	writeFile(t, passfile, "*:*:*:*:Sup3r:Secr3t\n")
	if err := os.Chmod(passfile, 0o600); err != nil {
		t.Fatal(err)
	}
	const kv = "host=127.0.0.1 port=1 user=app dbname=shop connect_timeout=2 sslmode=disable "
	const url = "postgres://app:%s@127.0.0.1:1/shop?connect_timeout=2&sslmode=disable"
	cases := []struct {
		name string
		dsn  string
		env  []string
	}{
		{"url", strings.Replace(url, "%s", "Sup3r-Secr3t", 1), nil},
		{"url at", strings.Replace(url, "%s", "Sup3r@Secr3t", 1), nil},
		{"url hash", strings.Replace(url, "%s", "Sup3r#Secr3t", 1), nil},
		{"url slash", strings.Replace(url, "%s", "Sup3r/Secr3t", 1), nil},
		{"url space", strings.Replace(url, "%s", "Sup3r Secr3t", 1), nil},
		{"url percent", strings.Replace(url, "%s", "Sup3r%25Secr3t", 1), nil},
		{"url bad escape", strings.Replace(url, "%s", "Sup3r%zzSecr3t", 1), nil},
		{"url amp", strings.Replace(url, "%s", "Sup3r&Secr3t", 1), nil},
		{"url digits query", strings.Replace(url, "%s", "2024?Sup3r-Secr3t", 1), nil},
		{"url digits slash", strings.Replace(url, "%s", "2024/Sup3r-Secr3t", 1), nil},
		{"url unknown parameter", "postgres://app@127.0.0.1:1/shop?connect_timeout=2&sslmode=disable&Password=Sup3r-Secr3t", nil},
		{"url query password", "postgres://app@127.0.0.1:1/shop?connect_timeout=2&sslmode=disable&password=Sup3r%26Secr3t", nil},
		{"url sslpassword", "postgres://app@127.0.0.1:1/shop?connect_timeout=2&sslmode=disable&sslpassword=Sup3r%20Secr3t", nil},
		{"multi-host url", "postgres://app:Sup3r@Secr3t@127.0.0.1:1,127.0.0.1:2/shop?connect_timeout=2&sslmode=disable", nil},
		{"kv", kv + "password=Sup3r&Secr3t", nil},
		{"kv quoted space", kv + "password='Sup3r Secr3t'", nil},
		{"kv escaped quote", kv + `password='Sup3r\' \\Secr3t'`, nil},
		{"kv unterminated", kv + "password='Sup3r Secr3t", nil},
		{"kv hash", kv + "password=Sup3r#Secr3t", nil},
		{"kv sslpassword", kv + "sslpassword='Sup3r Secr3t'", nil},
		{"kv unknown keyword", kv + "passwd=Sup3r-Secr3t", nil},
		{"kv oauth secret", kv + "oauth_client_secret=Sup3r-Secr3t", nil},
		{"kv options", kv + "options='-c my.key=Sup3r-Secr3t'", nil},
		{"passfile", kv + "passfile=" + passfile, nil},
		{"pgpassword", kv, []string{"PGPASSWORD", "Sup3r Secr3t"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := env{"WALRELAY_POSTGRES_DSN": tc.dsn, "WALRELAY_KAFKA_BROKERS": "127.0.0.1:1", "WALRELAY_ADMIN_LISTEN": ""}.with(tc.env...)
			for _, args := range [][]string{{"config"}, {"check"}, {"run"}} {
				_, out := runCmd(t, e, args...)
				if strings.Contains(out, "Sup3r") || strings.Contains(out, "Secr3t") {
					t.Errorf("walrelay %s printed the password:\n%s", args[0], out)
				}
			}
		})
	}
	t.Run("debezium import", func(t *testing.T) {
		t.Parallel()
		connector := filepath.Join(dir, "connector.properties")
		writeFile(t, connector, strings.Join([]string{
			"connector.class=io.debezium.connector.postgresql.PostgresConnector",
			"plugin.name=pgoutput",
			"database.hostname=db", "database.user=app", "database.dbname=shop",
			"database.password=Sup3r Secr3t",
			"database.sslpassword=Sup3r Secr3t",
			"transforms=outbox",
			"transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
			`producer.override.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="Sup3r Secr3t";`,
			"consumer.override.ssl.keystore.password=Sup3r Secr3t",
			"custom.vault.token=Sup3r Secr3t",
		}, "\n")+"\n")
		worker := filepath.Join(dir, "worker.properties")
		writeFile(t, worker, strings.Join([]string{
			"bootstrap.servers=kafka:9092",
			"key.converter=org.apache.kafka.connect.storage.StringConverter",
			"value.converter=org.apache.kafka.connect.storage.StringConverter",
			`producer.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="Sup3r Secr3t";`,
			"consumer.ssl.keystore.password=Sup3r Secr3t",
			"ssl.key.password=Sup3r Secr3t",
		}, "\n")+"\n")
		_, out := runCmd(t, env{}, "debezium", "import", connector, "--worker", worker)
		if strings.Contains(out, "Sup3r") || strings.Contains(out, "Secr3t") {
			t.Errorf("debezium import printed a secret:\n%s", out)
		}
		if !strings.Contains(out, "custom.vault.token") {
			t.Errorf("debezium import does not name the option it refuses:\n%s", out)
		}
	})
}
