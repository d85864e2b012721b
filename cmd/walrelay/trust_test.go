package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestCheckWarnsOfUnverifiedPostgres: walrelay check prints a WARN line for
// a PostgreSQL host reached without sslmode=verify-full (the default,
// require), naming the host and the fix, and none for a unix socket or a
// loopback address; the DSN's password is never printed. The connections
// fail (nothing listens): the line comes before them.
func TestCheckWarnsOfUnverifiedPostgres(t *testing.T) {
	t.Parallel()
	const password = "Pw-0f-the-DSN"
	for _, c := range []struct {
		dsn  string
		warn bool
	}{
		{"host=192.0.2.1 port=5432 user=app password=" + password + " dbname=shop connect_timeout=1 sslmode=require", true},
		{"postgres://app:" + password + "@192.0.2.1:5432/shop?connect_timeout=1", true}, // sslmode prefer: may be plaintext
		{"host=127.0.0.1 port=1 user=app password=" + password + " dbname=shop connect_timeout=1", false},
		{"host=/nonexistent-walrelay-socket-dir user=app password=" + password + " dbname=shop connect_timeout=1", false},
	} {
		var stdout, stderr bytes.Buffer
		_ = cmdCheck(t.Context(), []string{"--postgres.dsn", c.dsn}, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		warned := strings.Contains(out, "WARN  postgres tls") && strings.Contains(out, "sslmode=verify-full") && strings.Contains(out, "192.0.2.1")
		if warned != c.warn || strings.Contains(out, password) {
			t.Fatalf("check with %s: warned %v, want %v (and no password):\n%s", strings.ReplaceAll(c.dsn, password, "…"), warned, c.warn, out)
		}
	}
}

// TestRunWarnsOfUnverifiedPostgres: walrelay run, of either source, logs a
// warning at start for a PostgreSQL host reached without verify-full, and
// none for a loopback one; the password is not printed. The database is
// unreachable; the run is stopped after its start.
func TestRunWarnsOfUnverifiedPostgres(t *testing.T) {
	t.Parallel()
	const password = "Pw-0f-the-DSN"
	for _, c := range []struct {
		source, dsn string
		warn        bool
	}{
		{"wal", "host=192.0.2.1 user=app password=" + password + " dbname=shop connect_timeout=1 sslmode=require", true},
		{"poll", "host=192.0.2.1 user=app password=" + password + " dbname=shop connect_timeout=1", true},
		{"wal", "host=127.0.0.1 port=1 user=app password=" + password + " dbname=shop connect_timeout=1", false},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		var stderr bytes.Buffer
		_ = cmdRun(ctx, []string{"--source", c.source, "--postgres.dsn", c.dsn, "--kafka.brokers", "127.0.0.1:1", "--admin.listen", ""}, &stderr)
		cancel()
		out := stderr.String()
		warned := strings.Contains(out, "level=WARN") && strings.Contains(out, "postgres tls: 192.0.2.1")
		if warned != c.warn || strings.Contains(out, password) {
			t.Fatalf("run, source %s: warned %v, want %v (and no password):\n%s", c.source, warned, c.warn, out)
		}
	}
}
