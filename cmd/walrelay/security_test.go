package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/tlstest"
)

// TestKafkaTLSAndSASL streams to a broker that speaks only TLS (its
// certificate signed by a CA the test makes) and authenticates with each
// SASL mechanism, the password from a file or from the environment; one
// broker also requires a client certificate. The password never appears in
// walrelay's output. Wrong credentials, an untrusted CA and half a client
// certificate each stop walrelay with one line naming the problem.
func TestKafkaTLSAndSASL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certs, err := tlstest.New(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	const user, password = "walrelay", "kafka-s3cret-pw"
	pwFile := filepath.Join(dir, "sasl-password")
	writeFile(t, pwFile, password+"\n")
	cases := []struct {
		mechanism  string
		clientCert bool
		fromFile   bool
	}{
		{"PLAIN", false, true},
		{"SCRAM-SHA-256", true, false},
		{"SCRAM-SHA-512", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.mechanism, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t, kfake.TLS(certs.ServerConfig(tc.clientCert)), kfake.EnableSASL(), kfake.Superuser(tc.mechanism, user, password))
			auth := map[string]kgo.Opt{
				"PLAIN":         kgo.SASL(plain.Auth{User: user, Pass: password}.AsMechanism()),
				"SCRAM-SHA-256": kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha256Mechanism()),
				"SCRAM-SHA-512": kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha512Mechanism()),
			}[tc.mechanism]
			col, err := kafkatest.Collect(kc.Addrs(), `outbox\.event\..*|walrelay\.dlq`, kgo.DialTLSConfig(certs.ClientConfig(tc.clientCert)), auth)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(col.Close)
			pg := pgtest.Start(t)
			mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
			e := env{
				"WALRELAY_POSTGRES_DSN": pg.DSN, "WALRELAY_KAFKA_BROKERS": strings.Join(kc.Addrs(), ","), "WALRELAY_ADMIN_LISTEN": "",
				"WALRELAY_KAFKA_TLS_CA_FILE": certs.CAFile, "WALRELAY_KAFKA_SASL_MECHANISM": tc.mechanism, "WALRELAY_KAFKA_SASL_USERNAME": user,
			}
			if tc.fromFile {
				e["WALRELAY_KAFKA_SASL_PASSWORD_FILE"] = pwFile
			} else {
				e["WALRELAY_KAFKA_SASL_PASSWORD"] = password
			}
			if tc.clientCert {
				e["WALRELAY_KAFKA_TLS_CERT_FILE"], e["WALRELAY_KAFKA_TLS_KEY_FILE"] = certs.ClientCert, certs.ClientKey
			}
			p := streaming(t, e)
			w := newWriter(10, 20)
			if err := w.write(t.Context(), connect(t, pg.DSN), 300, 10); err != nil {
				t.Fatal(err)
			}
			c := waitAll(t, col, w.written(), time.Minute)
			t.Logf("TLS + SASL %s (client certificate %v, password from %s): %s", tc.mechanism, tc.clientCert, map[bool]string{true: "file", false: "environment"}[tc.fromFile], c)
			if strings.Contains(p.out.String(), password) {
				t.Fatalf("the SASL password is in walrelay's output")
			}
			if tc.clientCert {
				// The same broker refuses a walrelay without the client
				// certificate.
				noCert := e.with("WALRELAY_KAFKA_TLS_CERT_FILE", "", "WALRELAY_KAFKA_TLS_KEY_FILE", "")
				if code, out := runCmd(t, noCert, "run"); code != 1 || !strings.Contains(lastLine(out), "kafka.brokers") {
					t.Fatalf("without the client certificate: exit %d, last line %q", code, lastLine(out))
				}
			}
		})
	}

	t.Run("refusals", func(t *testing.T) {
		t.Parallel()
		kc := kafkatest.Start(t, kfake.TLS(certs.ServerConfig(false)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", user, password))
		pg := pgtest.Start(t)
		mustRun(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
		good := env{
			"WALRELAY_POSTGRES_DSN": pg.DSN, "WALRELAY_KAFKA_BROKERS": strings.Join(kc.Addrs(), ","), "WALRELAY_ADMIN_LISTEN": "",
			"WALRELAY_KAFKA_TLS_CA_FILE": certs.CAFile, "WALRELAY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
			"WALRELAY_KAFKA_SASL_USERNAME": user, "WALRELAY_KAFKA_SASL_PASSWORD": password,
		}
		for _, rc := range []struct {
			name string
			env  env
			want string
		}{
			{"wrong password", good.with("WALRELAY_KAFKA_SASL_PASSWORD", "not-the-password"), "the SASL credentials"},
			{"untrusted CA", good.with("WALRELAY_KAFKA_TLS_CA_FILE", "", "WALRELAY_KAFKA_TLS_ENABLED", "true"), "certificate"},
			{"no TLS", good.with("WALRELAY_KAFKA_TLS_CA_FILE", ""), "kafka.tls.enabled"},
			{"half a client certificate", good.with("WALRELAY_KAFKA_TLS_CERT_FILE", certs.ClientCert), "kafka.tls.cert_file is set without kafka.tls.key_file"},
			{"unknown mechanism", good.with("WALRELAY_KAFKA_SASL_MECHANISM", "GSSAPI"), `kafka.sasl.mechanism "GSSAPI"`},
			{"two passwords", good.with("WALRELAY_KAFKA_SASL_PASSWORD_FILE", pwFile), "kafka.sasl.password_file and kafka.sasl.password are both set"},
		} {
			t.Run(rc.name, func(t *testing.T) {
				t.Parallel()
				code, out := runCmd(t, rc.env, "run")
				if code != 1 || !strings.HasPrefix(lastLine(out), "walrelay: ") || !strings.Contains(lastLine(out), rc.want) {
					t.Fatalf("exit %d, last line %q, want exit 1 and a line with %q", code, lastLine(out), rc.want)
				}
				if strings.Contains(out, password) || strings.Contains(out, "not-the-password") {
					t.Fatalf("a password is in the output:\n%s", out)
				}
			})
		}
	})
}

// TestPostgresTLSVerifyFull: the server asks for a password over TLS only
// (scram-sha-256 on hostssl lines); walrelay connects with
// sslmode=verify-full against the test's CA, the password from
// postgres.password_file, and its replication session is encrypted. A host
// name that the certificate does not cover, and a wrong password, each stop
// it with one line, the password never printed.
func TestPostgresTLSVerifyFull(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "reconfigures the server")
	dir := t.TempDir()
	certs, err := tlstest.New(dir, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := pg.EnableTLS(ctx, certs.ServerCert, certs.ServerKey); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, pg.DSN)
	const password = "pg-s3cret-pw"
	if _, err := conn.Exec(ctx, "ALTER ROLE postgres PASSWORD '"+password+"'"); err != nil {
		t.Fatal(err)
	}
	// The test's own connections (sslmode=disable) stay trusted.
	if err := pg.WriteHBA(ctx, "local all all trust\nhostnossl all all 127.0.0.1/32 trust\n"+
		"hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl replication all 127.0.0.1/32 scram-sha-256\n"); err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(dir, "pg-password")
	writeFile(t, pwFile, password+"\n")
	dsn := func(host string) string {
		return fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=verify-full&sslrootcert=%s", host, pg.Port(), certs.CAFile)
	}
	e := baseEnv(pg, kc).with("WALRELAY_POSTGRES_DSN", dsn("localhost"), "WALRELAY_POSTGRES_PASSWORD_FILE", pwFile)
	p := streaming(t, e)
	w := newWriter(10, 21)
	if err := w.write(ctx, conn, 300, 10); err != nil {
		t.Fatal(err)
	}
	c := waitAll(t, col, w.written(), time.Minute)
	var senders int
	var encrypted bool
	if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(bool_and(s.ssl), false) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)`).Scan(&senders, &encrypted); err != nil {
		t.Fatal(err)
	}
	t.Logf("over TLS, verify-full, password from a file: %s; walsenders %d, encrypted %v", c, senders, encrypted)
	if senders != 1 || !encrypted {
		t.Fatalf("the replication session is not over TLS: %d walsenders, encrypted %v", senders, encrypted)
	}
	if strings.Contains(p.out.String(), password) {
		t.Fatal("the password is in walrelay's output")
	}
	wrongPw := filepath.Join(dir, "wrong")
	writeFile(t, wrongPw, "not-the-password\n")
	for _, rc := range []struct {
		name string
		env  env
		want string
	}{
		{"host not in the certificate", e.with("WALRELAY_POSTGRES_DSN", dsn("127.0.0.1"), "WALRELAY_POSTGRES_SLOT", "other"), "certificate"},
		{"wrong password", e.with("WALRELAY_POSTGRES_PASSWORD_FILE", wrongPw, "WALRELAY_POSTGRES_SLOT", "other"), "password authentication failed"},
		{"password twice", e.with("WALRELAY_POSTGRES_DSN", strings.Replace(dsn("localhost"), "postgres@", "postgres:"+password+"@", 1)), "postgres.password_file is set and postgres.dsn gives a password too"},
	} {
		code, out := runCmd(t, rc.env, "run")
		if code != 1 || !strings.Contains(lastLine(out), rc.want) {
			t.Fatalf("%s: exit %d, last line %q, want exit 1 and %q", rc.name, code, lastLine(out), rc.want)
		}
		if strings.Contains(out, password) || strings.Contains(out, "not-the-password") {
			t.Fatalf("%s: a password is in the output:\n%s", rc.name, out)
		}
	}
}

// TestWrongKafkaPort: kafka.brokers naming a KRaft controller's listener (a
// port that speaks Kafka's protocol but serves no client) is refused with
// what walrelay saw there and the fix, not the client library's guess ("is
// SASL missing?"). Against the real broker its controller listener; against
// kfake, a listener that answers as a controller does (API versions without
// Produce or Metadata, then the connection closed).
func TestWrongKafkaPort(t *testing.T) {
	t.Parallel()
	kc := newBroker(t)
	addr := ""
	if kc.real != nil {
		addr = kc.real.ControllerAddr()
	} else {
		kc.ControlKey(int16(kmsg.ApiVersions), func(req kmsg.Request) (kmsg.Response, error, bool) {
			kc.KeepControl()
			resp := req.ResponseKind().(*kmsg.ApiVersionsResponse)
			resp.Version = req.GetVersion()
			for _, key := range []int16{int16(kmsg.ApiVersions), int16(kmsg.Vote), int16(kmsg.Fetch)} {
				k := kmsg.NewApiVersionsResponseApiKey()
				k.ApiKey, k.MaxVersion = key, 3
				resp.ApiKeys = append(resp.ApiKeys, k)
			}
			return resp, nil, true
		})
		kc.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
			kc.KeepControl()
			return nil, errors.New("not a broker"), true
		})
		addr = kc.Addrs()[0]
	}
	pg := pgtest.Start(t)
	e := env{"WALRELAY_POSTGRES_DSN": pg.DSN, "WALRELAY_KAFKA_BROKERS": addr, "WALRELAY_ADMIN_LISTEN": ""}
	mustRun(t, e, "migrate")
	code, out := runCmd(t, e, "run")
	if code != 1 || !strings.Contains(lastLine(out), "as a KRaft controller's listener") || !strings.Contains(lastLine(out), "kafka.brokers must name the brokers' client listeners") ||
		strings.Contains(lastLine(out), "SASL missing") {
		t.Fatalf("run against a controller's listener: exit %d, last line %q", code, lastLine(out))
	}
	t.Logf("walrelay run against a controller's listener: %s", lastLine(out))
}
