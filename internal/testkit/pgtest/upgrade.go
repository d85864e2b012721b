package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// UpgradeOptions are the choices of an Upgrade.
type UpgradeOptions struct {
	// Check runs pg_upgrade --check only: the clusters are compared and
	// the old one is checked (its logical slots included), nothing is
	// changed, and the server stays the old one, stopped.
	Check bool
}

// Upgrade upgrades the server to the major version of the binaries in
// newBin with pg_upgrade --link, as an operator would: it stops the server
// cleanly (fast mode) if it runs, makes a new cluster with newBin's initdb
// (the same initdb arguments and settings, data checksums as the old
// cluster has them), runs newBin's pg_upgrade from the old cluster to it,
// and starts the new one on the same port, so DSN is unchanged. From
// PostgreSQL 17 on pg_upgrade carries the logical slots over; it refuses a
// slot that has not consumed every change of the WAL before the old
// cluster's shutdown checkpoint. A refused upgrade (or a Check) leaves the
// old server stopped, its data as it was, and returns pg_upgrade's output
// and the reports it wrote (invalid_logical_slots.txt and the like).
func (s *Server) Upgrade(ctx context.Context, newBin string, opts UpgradeOptions) (string, error) {
	if s.external {
		return "", errors.New("cannot upgrade the external server of " + EnvDSN)
	}
	checksums, err := s.dataChecksums(ctx)
	if err != nil {
		return "", err
	}
	if _, statErr := os.Stat(filepath.Join(s.data, "postmaster.pid")); statErr == nil {
		if err := s.Stop(ctx); err != nil {
			return "", err
		}
	}
	newData := filepath.Join(s.dir, "data-new")
	if err := os.RemoveAll(newData); err != nil {
		return "", fmt.Errorf("remove an earlier new cluster: %w", err)
	}
	args := append([]string{}, initdbArgs...)
	if !checksums {
		// PostgreSQL 18's initdb turns data checksums on by default, and
		// pg_upgrade wants both clusters alike.
		help, _ := s.runBin(ctx, newBin, "initdb", "--help")
		if strings.Contains(string(help), "--no-data-checksums") {
			args = append(args[:len(args)-1], "--no-data-checksums", "-D")
		}
	}
	if out, err := s.runBin(ctx, newBin, "initdb", append(args, newData)...); err != nil {
		return "", fmt.Errorf("initdb of the new cluster: %w\n%s", err, out)
	}
	if err := appendConf(newData, s.conf()); err != nil {
		return "", err
	}
	oldPort, err := freePort()
	if err != nil {
		return "", err
	}
	newPort, err := freePort()
	if err != nil {
		return "", err
	}
	upArgs := []string{"-b", s.bin, "-B", newBin, "-d", s.data, "-D", newData,
		"-p", fmt.Sprint(oldPort), "-P", fmt.Sprint(newPort), "-s", s.dir, "--link", "--no-sync"}
	if opts.Check {
		upArgs = append(upArgs, "--check")
	}
	out, err := s.runBin(ctx, newBin, "pg_upgrade", upArgs...)
	if err != nil || opts.Check {
		report := string(out) + reports(filepath.Join(newData, "pg_upgrade_output.d"))
		if err != nil {
			return report, fmt.Errorf("pg_upgrade: %w\n%s", err, report)
		}
		return report, nil
	}
	// The old cluster's files are the new one's now (--link): the old data
	// directory is kept aside, as pg_upgrade leaves it, and never started.
	s.bin, s.data = newBin, newData
	if err := s.StartServer(ctx); err != nil {
		return string(out), err
	}
	return string(out), nil
}

// dataChecksums reports whether the server's cluster has data checksums.
func (s *Server) dataChecksums(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	var on string
	if err := conn.QueryRow(ctx, "SHOW data_checksums").Scan(&on); err != nil {
		return false, fmt.Errorf("read data_checksums: %w", err)
	}
	return on == "on", nil
}

// runBin runs a program of another bin directory than the server's, as
// the postgres user where the server runs as it, in the server's directory.
func (s *Server) runBin(ctx context.Context, bin, name string, args ...string) ([]byte, error) {
	saved := s.bin
	s.bin = bin
	defer func() { s.bin = saved }()
	return s.run(ctx, name, args...)
}

// reports returns the text files pg_upgrade left under dir (the reports of
// what it refused), each under its name.
func reports(dir string) string {
	var b strings.Builder
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".txt") {
			return nil
		}
		if text, err := os.ReadFile(path); err == nil {
			fmt.Fprintf(&b, "--- %s:\n%s", filepath.Base(path), text)
		}
		return nil
	})
	return b.String()
}
