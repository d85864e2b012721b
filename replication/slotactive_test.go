package replication

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// germanLocale makes the locale de_DE.UTF-8 with localedef in a directory
// of its own, readable by the server's user, and returns the directory (a
// server started with LOCPATH set to it can set lc_messages to it). It
// skips the test when localedef, the locale's sources or PostgreSQL's
// German messages are missing.
func germanLocale(t *testing.T) string {
	t.Helper()
	if m, _ := filepath.Glob("/usr/share/locale/de/LC_MESSAGES/postgres*.mo"); len(m) == 0 {
		t.Skip("PostgreSQL's German messages are not installed (/usr/share/locale/de/LC_MESSAGES/postgres*.mo)")
	}
	if _, err := exec.LookPath("localedef"); err != nil {
		t.Skip("no localedef to make a German locale")
	}
	dir, err := os.MkdirTemp("/tmp", "wrloc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// localedef exits 1 on warnings while it writes the locale.
	out, err := exec.CommandContext(t.Context(), "localedef", "-i", "de_DE", "-f", "UTF-8", filepath.Join(dir, "de_DE.UTF-8")).CombinedOutput()
	if _, serr := os.Stat(filepath.Join(dir, "de_DE.UTF-8", "LC_MESSAGES")); serr != nil {
		t.Skipf("localedef could not make de_DE.UTF-8: %v\n%s", err, out)
	}
	return dir
}

// TestSlotActiveTranslated (issue 48 item 2): on a server whose messages
// are translated (lc_messages de_DE.UTF-8), a START_REPLICATION refused as
// the slot is active (55006, "Replikations-Slot »walrelay« ist aktiv für
// PID N") still names the walsender that holds it: walrelay reads its pid
// from pg_replication_slots, not from the message, and never says "pid 0".
// Not parallel: the server must start with LOCPATH in its environment.
func TestSlotActiveTranslated(t *testing.T) {
	t.Setenv("LOCPATH", germanLocale(t))
	pg := streamed(t, 1)
	ctx := t.Context()
	admin := mustConnect(t, pg.DSN)
	for _, sql := range []string{"ALTER SYSTEM SET lc_messages = 'de_DE.UTF-8'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
	start := func() (*pgconn.PgConn, error) {
		c := mustConnect(t, pg.DSN+"&replication=database")
		return c, pglogrepl.StartReplication(ctx, c, "walrelay", 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'walrelay_outbox'"}})
	}
	holder, err := start()
	if err != nil {
		t.Fatal(err)
	}
	repl, err := start()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55006" {
		t.Fatalf("START_REPLICATION of a held slot: %v, want 55006", err)
	}
	if strings.Contains(pgErr.Message, "active for PID") {
		// Debian's server binaries find their German messages
		// (postgres-<major>.mo); a build without them (the npm
		// binaries of other versions) cannot translate.
		major, _, _ := strings.Cut(admin.ParameterStatus("server_version"), ".")
		if m, _ := filepath.Glob("/usr/share/locale/de/LC_MESSAGES/postgres-" + major + ".mo"); len(m) == 0 {
			t.Skipf("PostgreSQL %s here has no German messages: the server cannot translate", major)
		}
		t.Fatalf("the server's message is not translated: %q", pgErr.Message)
	}
	active := (&Stream{cfg: Config{Slot: "walrelay"}}).slotActive(ctx, repl, pgErr)
	if uint32(active.PID) != holder.PID() || strings.Contains(active.Error(), "pid 0") {
		t.Fatalf("the server said %q; walrelay: pid %d (%q), want %d", pgErr.Message, active.PID, active.Error(), holder.PID())
	}
	if msg := (&SlotActiveError{Slot: "walrelay"}).Error(); strings.Contains(msg, "pid 0") {
		t.Fatalf("a holder of unknown pid: %q", msg)
	}
}

// mustConnect opens a connection of the low-level kind the stream uses,
// closed when the test ends.
func mustConnect(t *testing.T, dsn string) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}
