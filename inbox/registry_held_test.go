package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/walrelay/walrelay/format/registry"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// TestRegistryWrongCredentialsHeldAndSaid: a registry that refuses the
// consumer's credentials (401) holds the partition as an outage does
// (nothing dead-lettered, nothing handled), but the log says the
// credentials were refused, not that the registry is unavailable, and
// walrelay_inbox_registry_waits_total{reason="credentials"} and
// walrelay_inbox_registry_held{topic,partition} tell an alert so.
func TestRegistryWrongCredentialsHeldAndSaid(t *testing.T) {
	e := setup(t, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error_code":40101,"message":"Unauthorized"}`))
	}))
	defer srv.Close()
	reg, err := inbox.NewRegistry(inbox.RegistryConfig{URL: srv.URL, Username: "u", Password: "s3cret-pw", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	metrics := prometheus.NewRegistry()
	var handled int
	h := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var v any
		if err := m.Decode(ctx, &v); err != nil {
			return err
		}
		mu.Lock()
		handled++
		mu.Unlock()
		return nil
	}
	rec := event(outbox.NewID(), "order-1", 1)
	rec.Value = registry.Frame(nil, 7, []byte{2})
	e.produce(t, rec)
	stop := e.start(t, inbox.Config{Logger: logger, Registerer: metrics, Registry: reg, RetryBackoffMin: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}, h)
	waits := mustVec(t, metrics, "walrelay_inbox_registry_waits_total")
	waitfor.Until(t, 20*time.Second, "the record held on the registry's refusal", func() bool { return testutil.ToFloat64(waits) >= 3 })
	if got := testutil.ToFloat64(mustVec(t, metrics, "walrelay_inbox_registry_held")); got != 1 {
		t.Errorf("walrelay_inbox_registry_held: %v, want 1", got)
	}
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "refused the consumer's credentials") || strings.Contains(out, "schema registry unavailable") {
		t.Errorf("the log does not say the credentials were refused:\n%.2000s", out)
	}
	if strings.Contains(out, "s3cret-pw") {
		t.Error("the log prints the password")
	}
	fams, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "walrelay_inbox_registry_waits_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() != "credentials" {
					t.Errorf("registry waits counted with reason %q, want credentials", l.GetValue())
				}
			}
		}
	}
	if handled != 0 {
		t.Errorf("%d handled", handled)
	}
	if got := testutil.ToFloat64(mustVec(t, metrics, "walrelay_inbox_dead_lettered_total")); got != 0 {
		t.Errorf("%v dead-lettered, want none", got)
	}
}
