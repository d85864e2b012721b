package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// initdbArgs are the arguments of every throwaway cluster's initdb (the
// data directory follows).
var initdbArgs = []string{"--no-sync", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-D"}

// EnvNoTemplate, set to anything, turns the template off: every server runs
// initdb itself.
const EnvNoTemplate = "WALRELAY_TEST_PG_NO_TEMPLATE"

// initdb makes s.data a new cluster. initdb takes about 1.5 s of CPU (its
// bootstrap runs the catalog scripts through a single-user backend), and
// the test suite starts a couple of hundred servers: so it runs once per set
// of server binaries, into a template kept in the user's cache directory,
// and each server gets a copy (a few hundredths of a second) with a system
// identifier of its own, as initdb would give it (an exactly-once relay
// names its Kafka transactional id after it, and tests sharing one real
// broker must not fence each other). Where the template cannot be made or
// patched, initdb runs as before.
func (s *Server) initdb(ctx context.Context) error {
	if os.Getenv(EnvNoTemplate) == "" {
		tmpl, err := templates.get(ctx, s)
		if err == nil {
			if err = s.copyTemplate(ctx, tmpl); err == nil {
				templateCopies.Add(1)
				return nil
			}
			_ = os.RemoveAll(s.data)
		}
	}
	if out, err := s.run(ctx, "initdb", append(initdbArgs, s.data)...); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

// copyTemplate copies the template data directory to s.data and gives the
// copy a system identifier of its own.
func (s *Server) copyTemplate(ctx context.Context, tmpl string) error {
	// cp -a keeps the modes PostgreSQL insists on and, run as root, the
	// postgres user's ownership.
	if out, err := exec.CommandContext(ctx, "cp", "-a", tmpl, s.data).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the template data directory: %w: %s", err, out)
	}
	return newSystemIdentifier(s.data)
}

// templateCache makes each template at most once per process; the test
// binaries of other packages, running at the same time, may make the same
// one: each makes its own and renames it into place.
type templateCache struct {
	mu   sync.Mutex
	done map[string]string
}

var templates templateCache

// templateCopies counts the servers made from a template (for its test:
// a failure falls back to initdb silently).
var templateCopies atomic.Int64

// get returns the template data directory for s's binaries and user,
// making it first if no process has.
func (c *templateCache) get(ctx context.Context, s *Server) (string, error) {
	key, err := templateKey(s)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.done[key]; ok {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the template: %w", err)
	}
	root := filepath.Join(cache, "walrelay", "pgtest")
	final := filepath.Join(root, key)
	if _, err := os.Stat(filepath.Join(final, "global", "pg_control")); err != nil {
		if err := makeTemplate(ctx, s, root, final); err != nil {
			return "", err
		}
	}
	if c.done == nil {
		c.done = map[string]string{}
	}
	c.done[key] = final
	return final, nil
}

// makeTemplate runs initdb in a directory of its own under /tmp (the
// postgres user, which runs it when the tests run as root, may not reach
// root's cache directory), copies the result under root and renames it to
// final.
func makeTemplate(ctx context.Context, s *Server, root, final string) error {
	work, err := os.MkdirTemp("/tmp", "wrpgtmpl")
	if err != nil {
		return fmt.Errorf("make a directory for the template: %w", err)
	}
	defer os.RemoveAll(work)
	if s.asUser != nil {
		if err := chownPostgres(work); err != nil {
			return err
		}
	}
	data := filepath.Join(work, "data")
	argv := append(append([]string{}, s.asUser...), filepath.Join(s.bin, "initdb"))
	argv = append(append(argv, initdbArgs...), data)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb the template: %w\n%s", err, out)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("make %s: %w", root, err)
	}
	staging, err := os.MkdirTemp(root, "tmp")
	if err != nil {
		return fmt.Errorf("make a directory for the template: %w", err)
	}
	defer os.RemoveAll(staging)
	if out, err := exec.CommandContext(ctx, "cp", "-a", data, staging).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the template: %w: %s", err, out)
	}
	if err := os.Rename(filepath.Join(staging, "data"), final); err != nil {
		if _, statErr := os.Stat(filepath.Join(final, "global", "pg_control")); statErr != nil {
			return fmt.Errorf("put the template in place: %w", err)
		}
		// Another process put its template there first: the same.
	}
	return nil
}

// templateKey names a template after what makes one: the server binaries
// (their directory, and initdb's and postgres's size and time), the user
// that runs them and initdb's arguments.
func templateKey(s *Server) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "walrelay pgtest template 1\n%s\n%s\n%s\n", s.bin, strings.Join(s.asUser, " "), strings.Join(initdbArgs, " "))
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(s.bin, name))
		if err != nil {
			return "", fmt.Errorf("stat %s: %w", name, err)
		}
		fmt.Fprintf(h, "%s %d %d\n", name, fi.Size(), fi.ModTime().UnixNano())
	}
	return "pg-" + hex.EncodeToString(h.Sum(nil)[:12]), nil
}

// newSystemIdentifier gives the cluster in data, shut down cleanly, a new
// system identifier: in pg_control (its first field; the file's CRC-32C,
// which follows the fields it covers, computed again) and in the long
// header of each WAL segment's first page (xlp_sysid, after the 24-byte
// short header), which must match it. Each place is checked to hold the
// old identifier before it is written, so a layout other than the one
// expected is an error, not a corrupt cluster.
func newSystemIdentifier(data string) error {
	ctlPath := filepath.Join(data, "global", "pg_control")
	ctl, err := os.ReadFile(ctlPath)
	if err != nil {
		return fmt.Errorf("read pg_control: %w", err)
	}
	if len(ctl) < 512 {
		return fmt.Errorf("pg_control of %d bytes", len(ctl))
	}
	end := -1 // the offset of the CRC: the length of what it covers
	for n := 16; n+4 <= 512; n += 4 {
		if crc32.Checksum(ctl[:n], crcTable) == binary.NativeEndian.Uint32(ctl[n:]) {
			end = n
			break
		}
	}
	if end < 0 {
		return errors.New("pg_control: no CRC-32C where one was expected")
	}
	old := binary.NativeEndian.Uint64(ctl)
	// As initdb makes one: the seconds, the microseconds, then random bits.
	var r [2]byte
	_, _ = rand.Read(r[:])
	now := time.Now()
	id := uint64(now.Unix())<<32 | uint64(now.Nanosecond()/1000)<<12 | uint64(binary.NativeEndian.Uint16(r[:])&0xFFF)
	if id == old {
		id++
	}
	segs, err := filepath.Glob(filepath.Join(data, "pg_wal", strings.Repeat("[0-9A-F]", 24)))
	if err != nil || len(segs) == 0 {
		return fmt.Errorf("no WAL segment in %s: %v", filepath.Join(data, "pg_wal"), err)
	}
	for _, seg := range segs {
		if err := patchUint64(seg, 24, old, id); err != nil {
			return fmt.Errorf("WAL segment %s: %w", filepath.Base(seg), err)
		}
	}
	binary.NativeEndian.PutUint64(ctl, id)
	binary.NativeEndian.PutUint32(ctl[end:], crc32.Checksum(ctl[:end], crcTable))
	return writeAt(ctlPath, 0, ctl)
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// patchUint64 writes v at off in the file at path if it holds old there.
func patchUint64(path string, off int64, old, v uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	var b [8]byte
	_, err = f.ReadAt(b[:], off)
	f.Close()
	if err != nil {
		return err
	}
	if got := binary.NativeEndian.Uint64(b[:]); got != old {
		return fmt.Errorf("system identifier %d at offset %d, want %d", got, off, old)
	}
	binary.NativeEndian.PutUint64(b[:], v)
	return writeAt(path, off, b[:])
}

// writeAt writes b at off in the file at path, keeping its owner and mode.
func writeAt(path string, off int64, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, off)
	return errors.Join(err, f.Close())
}
