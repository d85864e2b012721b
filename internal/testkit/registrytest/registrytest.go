// Package registrytest runs a real schema registry for tests: Apicurio
// Registry, fetched from Maven Central with mvn the first time (cached
// under ~/.cache/walrelay), in-memory storage, on a free loopback port,
// stopped when the test ends. It serves Confluent's Schema Registry API at
// URL(), the API that walrelay's registry formats and Debezium's
// converters (Apicurio's, with as-confluent) speak.
//
// Tests that need it are gated: they run only with WALRELAY_TEST_REGISTRY=1
// (.ci/run sets it); Start skips the test otherwise.
package registrytest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/freeport"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// Version is the Apicurio Registry release that Start runs.
const Version = "2.6.13.Final"

// Env gates the tests that start a registry: they run when it is "1".
const Env = "WALRELAY_TEST_REGISTRY"

// Artifact is the Maven coordinate of the registry's distribution (about
// 142 MB).
const Artifact = "io.apicurio:apicurio-registry-app:" + Version + ":tar.gz:all"

// CCompatPath is where Apicurio serves Confluent's Schema Registry API.
const CCompatPath = "/apis/ccompat/v7"

// TB is the part of testing.TB that Start uses.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Registry is a running Apicurio Registry.
type Registry struct {
	base string // http://127.0.0.1:port
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

// Start starts a registry that is stopped when the test ends, or skips the
// test unless WALRELAY_TEST_REGISTRY=1.
func Start(t TB) *Registry {
	t.Helper()
	if os.Getenv(Env) != "1" {
		t.Skip("starts Apicurio Registry (Java, fetched from Maven Central): set " + Env + "=1 (.ci/run does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, err := New(ctx)
	if err != nil {
		t.Fatalf("start Apicurio Registry: %v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// Fetch makes sure the registry's distribution is unpacked in the cache
// directory (WALRELAY_REGISTRY_CACHE, default
// ~/.cache/walrelay/apicurio-registry-<version>) and returns the path of
// its runner jar. The first call runs Maven and tar.
func Fetch(ctx context.Context) (string, error) {
	dir := os.Getenv("WALRELAY_REGISTRY_CACHE")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find a cache directory for Apicurio Registry: %w", err)
		}
		dir = filepath.Join(home, ".cache", "walrelay", "apicurio-registry-"+Version)
	}
	app := filepath.Join(dir, "app")
	if _, err := os.Stat(app); err != nil {
		if err := fetch(ctx, dir, app); err != nil {
			return "", err
		}
	}
	return runner(app)
}

// fetch downloads and unpacks the distribution into a directory of its
// own, renamed to app once complete (several test binaries may fetch at
// once on a fresh machine).
func fetch(ctx context.Context, dir, app string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make the cache for Apicurio Registry: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "app.tmp-")
	if err != nil {
		return fmt.Errorf("make the cache for Apicurio Registry: %w", err)
	}
	defer os.RemoveAll(tmp)
	get := exec.CommandContext(ctx, "mvn", "-q", "-B", "dependency:copy", "-Dartifact="+Artifact, "-DoutputDirectory="+tmp, "-Dmdep.stripVersion=false")
	get.Dir = tmp // no pom here: dependency:copy needs none
	if out, err := get.CombinedOutput(); err != nil {
		return fmt.Errorf("fetch %s with Maven (needs mvn and Maven Central): %v\n%s", Artifact, err, out)
	}
	tars, _ := filepath.Glob(filepath.Join(tmp, "*.tar.gz"))
	if len(tars) != 1 {
		return fmt.Errorf("fetch %s: Maven left %d archives", Artifact, len(tars))
	}
	untar := exec.CommandContext(ctx, "tar", "-xzf", tars[0], "-C", tmp)
	if out, err := untar.CombinedOutput(); err != nil {
		return fmt.Errorf("unpack %s: %v\n%s", tars[0], err, out)
	}
	if err := os.Remove(tars[0]); err != nil {
		return err
	}
	if err := os.Rename(tmp, app); err != nil {
		if _, serr := os.Stat(app); serr == nil {
			return nil // another fetch finished first
		}
		return fmt.Errorf("put Apicurio Registry in place: %w", err)
	}
	return nil
}

// runner finds the runner jar in the unpacked distribution.
func runner(app string) (string, error) {
	var jar string
	err := filepath.WalkDir(app, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, "-runner.jar") {
			jar = p
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("look for Apicurio Registry's runner jar: %w", err)
	}
	if jar == "" {
		return "", fmt.Errorf("no *-runner.jar under %s: remove it to fetch again", app)
	}
	return jar, nil
}

// New fetches (once) and starts a registry on a free loopback port, with a
// small heap, and waits until it is ready: /health/ready answers 200 and,
// where /proc tells, the port's listener is its own process's (another
// test's server on the port would answer too).
func New(ctx context.Context) (*Registry, error) {
	jar, err := Fetch(ctx)
	if err != nil {
		return nil, err
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, errors.New("no java on PATH: Apicurio Registry needs Java 17 or later")
	}
	port, err := freeport.One()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "walrelay-registry")
	if err != nil {
		return nil, err
	}
	r := &Registry{base: fmt.Sprintf("http://127.0.0.1:%d", port), dir: dir, done: make(chan struct{})}
	env := []string{fmt.Sprintf("HTTP_PORT=%d", port), "QUARKUS_HTTP_HOST=127.0.0.1"}
	r.cmd, err = kafkatest.StartJavaEnv(dir, env, java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-jar", jar)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start Apicurio Registry: %w", err)
	}
	go func() {
		_ = r.cmd.Wait()
		close(r.done)
	}()
	hc := &http.Client{Timeout: time.Second}
	for {
		if resp, err := hc.Get(r.base + "/health/ready"); err == nil {
			resp.Body.Close()
			// Ready, and the answer is this registry's: the port's
			// listener is its process's, not another server's that took
			// the port first (this registry then fails to bind and exits).
			if ok, known := listens(r.cmd.Process.Pid, port); resp.StatusCode == http.StatusOK && (ok || !known) {
				return r, nil
			}
		}
		select {
		case <-r.done:
			err := fmt.Errorf("the registry exited: %s", r.Logs())
			r.Close()
			return nil, err
		case <-ctx.Done():
			err := fmt.Errorf("the registry was not ready: %w\n%s", ctx.Err(), r.Logs())
			r.Close()
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// URL is the base URL of the registry's Confluent-compatible API, the
// schema registry URL a client is given.
func (r *Registry) URL() string { return r.base + CCompatPath }

// Base is the registry's root URL (Apicurio's own API is under /apis).
func (r *Registry) Base() string { return r.base }

// Proxy returns a TCP proxy to the registry (its Addr in place of the
// registry's host and port; Down and Up cut and restore it), closed at
// the test's end.
func (r *Registry) Proxy(t TB) *proxy.Proxy {
	t.Helper()
	px, err := proxy.New(strings.TrimPrefix(r.base, "http://"))
	if err != nil {
		t.Fatalf("registry proxy: %v", err)
	}
	t.Cleanup(func() { px.Close() })
	return px
}

// Logs returns the end of the registry's output.
func (r *Registry) Logs() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "stdout.log"))
	if len(b) > 4000 {
		return "…" + string(b[len(b)-4000:])
	}
	return string(b)
}

// Close stops the registry and removes its files.
func (r *Registry) Close() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	os.RemoveAll(r.dir)
}
