package tracing

import (
	"bytes"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walrelay/walrelay/sink"
)

// syncBuffer is a bytes.Buffer safe for the exporter's goroutine and the
// test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestOTLPRedirectNotFollowed: an OTLP/HTTP endpoint (https, HTTP/2, its
// CA given by OTEL_EXPORTER_OTLP_CERTIFICATE) that answers with a
// redirect, to another host or to http on another port of its host, is
// not followed: the server it points at gets no request, so never the
// headers of OTEL_EXPORTER_OTLP_HEADERS (Go's client keeps every header
// but Authorization on a redirect to another host, and Authorization too
// on the same host). The endpoint itself is reached, over the TLS that
// the environment configures. The log line says that the endpoint answered
// with a redirect that walrelay does not follow, without the headers'
// values or the Location's query. Not parallel: it sets the environment.
func TestOTLPRedirectNotFollowed(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		status     int
	}{
		{"another host", "localhost", http.StatusTemporaryRedirect},
		{"http on another port of the same host", "127.0.0.1", http.StatusPermanentRedirect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reached, withKey atomic.Int32
			other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reached.Add(1)
				if r.Header.Get("X-Api-Key") != "" || r.Header.Get("Authorization") != "" {
					withKey.Add(1)
				}
			}))
			t.Cleanup(other.Close)
			ou, _ := url.Parse(other.URL)
			var asked atomic.Int32
			endpoint := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked.Add(1)
				w.Header().Set("Location", "http://"+tc.host+":"+ou.Port()+"/v1/traces?token=tok-secret")
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte("REDIRECT-BODY"))
			}))
			endpoint.EnableHTTP2 = true
			endpoint.StartTLS()
			t.Cleanup(endpoint.Close)
			ca := filepath.Join(t.TempDir(), "ca.pem")
			if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: endpoint.Certificate().Raw}), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.URL)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
			t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)
			t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=key-secret,authorization=Bearer%20bearer-secret")
			t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5000")
			var logs syncBuffer
			tr, err := New(t.Context(), Config{Enabled: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			_, end := tr.Publish(testEvent(), []byte("00-"+writerTrace+"-"+writerSpan+"-01"), nil)
			end(sink.Delivery{Topic: "orders", Partition: 0, Offset: 1}, nil)
			_ = tr.ForceFlush(t.Context())
			deadline := time.Now().Add(5 * time.Second)
			for tr.Dropped() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			_ = tr.Shutdown(t.Context())
			out := logs.String()
			t.Logf("log: %s", out)
			if asked.Load() == 0 {
				t.Errorf("the endpoint got no request (the TLS of OTEL_EXPORTER_OTLP_CERTIFICATE not used?)")
			}
			if n := reached.Load(); n != 0 {
				t.Errorf("the server the endpoint redirected to got %d requests, %d with x-api-key or Authorization", n, withKey.Load())
			}
			if tr.Dropped() == 0 || !strings.Contains(out, "redirect") || !strings.Contains(out, "does not follow") {
				t.Errorf("dropped %d; want the spans dropped and a log line saying the endpoint answered with a redirect walrelay does not follow", tr.Dropped())
			}
			for _, secret := range []string{"key-secret", "bearer-secret", "tok-secret", "REDIRECT-BODY"} {
				if strings.Contains(out, secret) {
					t.Errorf("the log prints %s", secret)
				}
			}
		})
	}
}
