package admin

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdminIdleConnectionClosed: a keep-alive connection that sends
// nothing after its answer is closed by the listener once the idle timeout
// has passed, instead of being held open for ever.
func TestAdminIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	defaults, err := Serve("127.0.0.1:0", mux, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defaults.Close()
	if to := defaults; to.IdleTimeout <= 0 || to.ReadTimeout <= 0 || to.WriteTimeout < MaxProfileDuration {
		t.Fatalf("timeouts read %s, write %s, idle %s: want all set, write at least the longest profile %s", to.ReadTimeout, to.WriteTimeout, to.IdleTimeout, MaxProfileDuration)
	}
	// The same listener with a short idle timeout, for a short test.
	short := listenerTimeouts
	short.idle = 500 * time.Millisecond
	addr := freeAddr(t)
	srv, err := serve(addr, mux, short, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The connection stays idle: the server must close it after the idle
	// timeout. Read blocks until then (EOF) or the test's own deadline.
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(srv.IdleTimeout + 3*time.Second))
	_, err = br.ReadByte()
	if err != io.EOF {
		t.Fatalf("idle keep-alive connection still open after %s (idle timeout %s): %v", time.Since(start).Round(time.Millisecond), srv.IdleTimeout, err)
	}
}

// TestAdminProfileDurationBounded: with pprof on, a profile or trace
// asked for longer than MaxProfileDuration is refused at once, and a short
// one is served; the command line is not.
func TestAdminProfileDurationBounded(t *testing.T) {
	t.Parallel()
	m := New()
	addr := freeAddr(t)
	srv, err := Serve(addr, m.Mux(fakeSource{}, "walrelay", false, true), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, path := range []string{"/debug/pprof/profile?seconds=3600", "/debug/pprof/trace?seconds=3600", "/debug/pprof/heap?seconds=3600", "/debug/pprof/profile?seconds=31"} {
		cl := http.Client{Timeout: 3 * time.Second}
		resp, err := cl.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v (a profile of that length was started)", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "at most") {
			t.Fatalf("GET %s: %s %q, want 400 naming the limit", path, resp.Status, body)
		}
	}
	// The command line may hold a DSN with its password (--postgres.dsn):
	// it is not served.
	resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/debug/pprof/cmdline: %s, want 404", resp.Status)
	}
	resp, err = http.Get("http://" + addr + "/debug/pprof/trace?seconds=0.1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a 0.1 s trace: %s, want 200", resp.Status)
	}
}

// fakeSource is a pipeline that streams and has nothing in flight.
type fakeSource struct{}

func (fakeSource) State() string      { return "streaming" }
func (fakeSource) InFlight() int      { return 0 }
func (fakeSource) Reconnects() uint64 { return 0 }
func (fakeSource) DataLosses() uint64 { return 0 }
func (fakeSource) Err() error         { return nil }

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestPublishedSeriesBounded: 10,000 distinct topics do not make 10,000
// series of walrelay_events_published_total: past the cap, their events
// count under topic="(other)", and every event is counted.
func TestPublishedSeriesBounded(t *testing.T) {
	t.Parallel()
	m := New()
	acked := m.Hooks().Acked
	for i := range 10000 {
		acked("public.outbox", fmt.Sprintf("outbox.event.t%d", i), "", time.Time{})
	}
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, total := 0, 0.0
	for _, f := range families {
		if f.GetName() != "walrelay_events_published_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			series++
			total += s.GetCounter().GetValue()
		}
	}
	if series > maxTopicSeries+1 || total != 10000 {
		t.Fatalf("%d series counting %v events, want at most %d (and (other)) counting 10000", series, total, maxTopicSeries)
	}
}

// TestAdminAnswersGETOnly (issue 48 item 2): every endpoint of the admin
// listener answers a method other than GET or HEAD with 405 Method Not
// Allowed and an Allow header (it answered POST with 200); GET and HEAD
// are served.
func TestAdminAnswersGETOnly(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	srv, err := Serve(addr, New().Mux(fakeSource{}, "walrelay", true, true), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/status", "/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/symbol"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodGet, http.MethodHead} {
			req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addr+path, strings.NewReader(""))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			allow := resp.Header.Get("Allow")
			switch method {
			case http.MethodGet, http.MethodHead:
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s %s: %s, want 200", method, path, resp.Status)
				}
			default:
				if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(allow, "GET") || !strings.Contains(allow, "HEAD") {
					t.Errorf("%s %s: %s, Allow %q; want 405 allowing GET, HEAD", method, path, resp.Status, allow)
				}
			}
		}
	}
}
