package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Snapshot copies the data directory of the stopped server, as a disk
// snapshot or a file-level backup would, and returns a function that puts
// the copy back (with the server stopped again). The restored server has
// the same system identifier and timeline and none of the WAL written
// after the copy.
func (s *Server) Snapshot(ctx context.Context) (restore func(context.Context) error, err error) {
	if s.external {
		return nil, errors.New("cannot snapshot the external server of " + EnvDSN)
	}
	saved := s.data + ".snapshot"
	if out, err := exec.CommandContext(ctx, "cp", "-a", s.data, saved).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("copy the data directory: %w: %s", err, out)
	}
	return func(ctx context.Context) error {
		if err := os.RemoveAll(s.data); err != nil {
			return fmt.Errorf("remove the data directory: %w", err)
		}
		if out, err := exec.CommandContext(ctx, "cp", "-a", saved, s.data).CombinedOutput(); err != nil {
			return fmt.Errorf("restore the data directory: %w: %s", err, out)
		}
		return nil
	}, nil
}

// Standby makes a physical standby of the server, streaming from it through
// the physical slot slot (created here), with hot_standby_feedback and, from
// PostgreSQL 17, sync_replication_slots on: it stops the server cleanly,
// copies its data directory without its slots (as a base backup would; the
// npm packages of PostgreSQL ship no pg_basebackup), starts it again and
// starts the copy with standby.signal. The standby's DSN names the same
// database.
func (s *Server) Standby(ctx context.Context, slot string) (*Server, error) {
	if s.external {
		return nil, errors.New("cannot make a standby of the external server of " + EnvDSN)
	}
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	var version int
	err = conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&version)
	if err == nil {
		_, err = conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slot)
	}
	conn.Close(context.Background())
	if err != nil {
		return nil, fmt.Errorf("create the physical slot %s: %w", slot, err)
	}
	if err := s.Stop(ctx); err != nil {
		return nil, err
	}
	st := &Server{bin: s.bin, asUser: s.asUser}
	st.dir, err = os.MkdirTemp("/tmp", "wrpg")
	if err != nil {
		return nil, fmt.Errorf("make standby directory: %w", err)
	}
	st.data = filepath.Join(st.dir, "data")
	if out, err := exec.CommandContext(ctx, "cp", "-a", s.data, st.data).CombinedOutput(); err != nil {
		st.Close()
		return nil, fmt.Errorf("copy the data directory: %w: %s", err, out)
	}
	if s.asUser != nil {
		if err := chownPostgres(st.dir); err != nil {
			st.Close()
			return nil, err
		}
	}
	if err := s.StartServer(ctx); err != nil {
		st.Close()
		return nil, err
	}
	if st.port, err = freePort(); err != nil {
		st.Close()
		return nil, err
	}
	u, _ := url.Parse(s.DSN)
	db := strings.TrimPrefix(u.Path, "/")
	conf := fmt.Sprintf("port = %d\nunix_socket_directories = '%s'\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres dbname=%s application_name=standby'\n"+
		"primary_slot_name = '%s'\nhot_standby_feedback = on\n", st.port, st.dir, s.port, db, slot)
	if version >= 17 {
		conf += "sync_replication_slots = on\n"
	}
	for name, content := range map[string]string{"postgresql.auto.conf": conf, "standby.signal": ""} {
		path := filepath.Join(st.data, name)
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
		if err == nil {
			_, err = f.WriteString(content)
			err = errors.Join(err, f.Close())
		}
		if err == nil && s.asUser != nil {
			err = chownPostgres(path)
		}
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("write the standby's %s: %w", name, err)
		}
	}
	_ = os.Remove(filepath.Join(st.data, "postmaster.pid"))
	// A base backup holds no slots: the copy's would be stale copies that
	// sync_replication_slots refuses to replace.
	slots, _ := filepath.Glob(filepath.Join(st.data, "pg_replslot", "*"))
	for _, d := range slots {
		if err := os.RemoveAll(d); err != nil {
			st.Close()
			return nil, fmt.Errorf("remove the copied slot %s: %w", d, err)
		}
	}
	if err := st.StartServer(ctx); err != nil {
		st.Close()
		return nil, err
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", st.port)
	st.DSN = u.String()
	return st, nil
}

// Promote promotes a standby to a primary and waits until it is one.
func (s *Server) Promote(ctx context.Context) error { return s.pgctl(ctx, "-w", "-t", "60", "promote") }
