package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/proxy"
	"github.com/walrelay/walrelay/internal/testkit/syncbuf"
)

// TestOwnLostSessionIsEnded: the connection of a session is lost without
// the server hearing of it (stranded: the server's end stays open and
// silent, as after a NAT or load balancer dropped it), while new
// connections get through. The next Open ends the walsender of that last
// session, which still holds the slot, and streams at once, instead of
// waiting for wal_sender_timeout (10 minutes here). Another process's
// walsender is never ended (TestOpenUnlessTaken).
func TestOwnLostSessionIsEnded(t *testing.T) {
	t.Parallel()
	for _, role := range []string{"postgres", "relay"} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			ownLostSessionIsEnded(t, role)
		})
	}
}

// ownLostSessionIsEnded is TestOwnLostSessionIsEnded as role (a superuser,
// or a role with only LOGIN REPLICATION, as docs/security.md advises).
func ownLostSessionIsEnded(t *testing.T, role string) {
	pg := streamed(t, 1)
	cfg, err := pgx.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if role != cfg.User {
		conn := pgtest.Connect(t, pg.DSN)
		execer(t, conn)("CREATE ROLE " + role + " LOGIN REPLICATION")
		cfg.User = role
	}
	px, err := proxy.New(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	cfg.Host, cfg.Port = "127.0.0.1", uint16(px.Gate.Addr().(*net.TCPAddr).Port)
	cfg.RuntimeParams["wal_sender_timeout"] = "10min"
	var logs syncbuf.Buffer
	s, err := New(Config{ConnConfig: &cfg.Config, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.Open(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	lost := s.lastPID
	px.Strand()
	sess.Close(errors.New("nothing arrived: the connection is lost"))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a hang check: the old code waits 10 minutes
	defer cancel()
	start := time.Now()
	again, err := s.Open(ctx)
	if err != nil {
		t.Fatalf("Open after the last session's connection was lost: %v (walsender pid %d still holds the slot)\n%s", err, lost, logs.String())
	}
	defer again.Close(errors.New("test over"))
	t.Logf("streaming again after %s", time.Since(start).Round(10*time.Millisecond))
	if s.lastPID == lost {
		t.Fatalf("the new session has the lost one's walsender pid %d", lost)
	}
	if !strings.Contains(logs.String(), "its walsender ended") {
		t.Fatalf("no line says the lost session's walsender was ended:\n%s", logs.String())
	}
}
