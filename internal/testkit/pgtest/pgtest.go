// Package pgtest runs throwaway PostgreSQL servers for walrelay's tests and
// its demo: initdb into a temporary directory, wal_level=logical, fsync off,
// listening on a free loopback port and a socket in a short directory, as the
// postgres user when run as root (PostgreSQL refuses to run as root).
//
// WALRELAY_TEST_POSTGRES_DSN names an existing server instead (it must have
// wal_level=logical); each test then gets a database of its own, and tests
// that restart or kill the server are skipped with a message.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/freeport"
)

// EnvDSN names an existing server to test against.
const EnvDSN = "WALRELAY_TEST_POSTGRES_DSN"

// Server is one PostgreSQL server and a database on it.
type Server struct {
	// DSN connects to the test database as a superuser over TCP.
	DSN string

	external bool
	bin      string
	dir      string // the data directory's parent; removed by Close
	data     string
	port     int
	asUser   []string // command prefix that runs as the postgres user
	dropDB   string   // database to drop on Close (external servers)
	adminDSN string
}

// TB is the part of testing.TB that Start uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	Logf(format string, args ...any)
}

// Settings are the server settings of a throwaway cluster.
var Settings = map[string]string{
	"wal_level":             "logical",
	"fsync":                 "off",
	"full_page_writes":      "off",
	"max_replication_slots": "20",
	"max_wal_senders":       "20",
	"max_connections":       "100",
	"listen_addresses":      "127.0.0.1",
	"log_min_messages":      "warning",
	"shared_buffers":        "128MB",
}

// Start gives a test its own server (or its own database on the server of
// EnvDSN) and stops it when the test ends.
func Start(t TB) *Server {
	t.Helper()
	return started(t, New)
}

// StartBin is Start with the server binaries of bin (a bin directory),
// whatever PG_BINDIR and EnvDSN say: for a test of particular versions,
// such as an upgrade from one to another.
func StartBin(t TB, bin string) *Server {
	t.Helper()
	return started(t, func(ctx context.Context) (*Server, error) { return newThrowaway(ctx, bin) })
}

// started gives a test the server that newServer starts (within a minute)
// and stops it when the test ends.
func started(t TB, newServer func(context.Context) (*Server, error)) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := newServer(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Logf("stop postgres: %v", err)
		}
	})
	return s
}

// Connect gives a test a connection to dsn (a server of Start's, or
// another database on it), closed when the test ends.
func Connect(t TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// New starts a server, or creates a database on the server of EnvDSN.
func New(ctx context.Context) (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return external(ctx, dsn)
	}
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	return newThrowaway(ctx, bin)
}

// newThrowaway starts a throwaway server with the binaries of bin.
func newThrowaway(ctx context.Context, bin string) (*Server, error) {
	var err error
	s := &Server{bin: bin}
	if u, err := user.Current(); err == nil && u.Uid == "0" {
		s.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	// The socket path must stay under 107 bytes: a short directory in /tmp.
	s.dir, err = os.MkdirTemp("/tmp", "wrpg")
	if err != nil {
		return nil, fmt.Errorf("make postgres directory: %w", err)
	}
	s.data = filepath.Join(s.dir, "data")
	if s.asUser != nil {
		if err := chownPostgres(s.dir); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.initdb(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.port, err = freePort()
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := appendConf(s.data, s.conf()); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.StartServer(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	return s, nil
}

// conf is the postgresql.conf text of a throwaway server's settings.
func (s *Server) conf() string {
	conf := fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\n", s.port, s.dir)
	keys := make([]string, 0, len(Settings))
	for k := range Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		conf += fmt.Sprintf("%s = '%s'\n", k, Settings[k])
	}
	return conf
}

// appendConf appends conf to the postgresql.conf of the cluster in data.
func appendConf(data, conf string) error {
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	return nil
}

// FindBinDir finds the PostgreSQL server binaries: PG_BINDIR, else the
// newest /usr/lib/postgresql/*/bin.
func FindBinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("PG_BINDIR=%s has no initdb: %w", d, err)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries: install them (apt-get install postgresql, version 15 or later), " +
		"or set PG_BINDIR to their directory, or set " + EnvDSN + " to a server with wal_level=logical")
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func external(ctx context.Context, dsn string) (*Server, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", EnvDSN, err)
	}
	defer conn.Close(ctx)
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return nil, fmt.Errorf("read wal_level of %s: %w", EnvDSN, err)
	}
	if level != "logical" {
		return nil, fmt.Errorf("the server of %s has wal_level=%s; walrelay's tests need logical", EnvDSN, level)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	db := "walrelay_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return nil, fmt.Errorf("create test database: %w", err)
	}
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("%s must be a postgres:// URL", EnvDSN)
	}
	u.Path = "/" + db
	return &Server{DSN: u.String(), external: true, dropDB: db, adminDSN: dsn}, nil
}

// External reports whether the server is the one of EnvDSN, which tests may
// not restart or kill.
func (s *Server) External() bool { return s.external }

// Port returns the server's TCP port (0 for an external server).
func (s *Server) Port() int { return s.port }

// DSNFor returns the DSN of another database on the same server.
func (s *Server) DSNFor(db string) string {
	u, _ := url.Parse(s.DSN)
	u.Path = "/" + db
	return u.String()
}

func (s *Server) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, s.asUser...), filepath.Join(s.bin, name))
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

func (s *Server) pgctl(ctx context.Context, args ...string) error {
	if s.external {
		return errors.New("cannot control the external server of " + EnvDSN)
	}
	args = append([]string{"-D", s.data, "-l", filepath.Join(s.dir, "server.log")}, args...)
	if out, err := s.run(ctx, "pg_ctl", args...); err != nil {
		return fmt.Errorf("pg_ctl %s: %w\n%s%s", strings.Join(args, " "), err, out, s.logTail())
	}
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// StartServer starts a stopped server and waits until it accepts connections.
func (s *Server) StartServer(ctx context.Context) error {
	return s.pgctl(ctx, "-w", "-t", "60", "start")
}

// Stop stops the server cleanly (fast mode: sessions are ended).
func (s *Server) Stop(ctx context.Context) error { return s.pgctl(ctx, "-w", "-m", "fast", "stop") }

// Kill stops the server without a shutdown checkpoint, as a crash would.
func (s *Server) Kill(ctx context.Context) error {
	return s.pgctl(ctx, "-w", "-m", "immediate", "stop")
}

// Restart stops the server in fast mode and starts it again.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Stop(ctx); err != nil {
		return err
	}
	return s.StartServer(ctx)
}

// Version returns the server's major version (15, 16, …).
func (s *Server) Version(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&n); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	return n / 10000, nil
}

// Close stops the server and removes its files, or drops the test database
// of an external server (and its slots).
func (s *Server) Close() error {
	if s.external {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.adminDSN)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active", s.dropDB)
		_, err2 := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+s.dropDB+" WITH (FORCE)")
		return errors.Join(err, err2)
	}
	var err error
	if s.data != "" {
		if _, statErr := os.Stat(filepath.Join(s.data, "postmaster.pid")); statErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = s.pgctl(ctx, "-w", "-m", "immediate", "stop")
			cancel()
		}
	}
	if s.dir != "" {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}

func chownPostgres(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root needs a postgres user to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("chown %s to postgres: %w", dir, err)
	}
	return nil
}

// freePort is a port for a server of the tests (freeport.One).
func freePort() (int, error) { return freeport.One() }
