package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// TestAvroKeySchemaRefusedStops: in the avro key format, the key's schema
// follows the aggregate id column (its type and NOT NULL), the same for
// every event of the topic, so a registry refusing it (409 incompatible
// after a DDL made the column NOT NULL or changed its type; or, without
// auto-registration, not having it under <topic>-key) is a configuration
// to mend, not a bad event: walrelay stops (a fatal error naming the
// subject and what to do), nothing dead-lettered, as for ErrKeyType and
// as Debezium's converter fails its task. It dead-lettered every event of
// the topic (the review's
// TestProbeAvroKeySchemaRefusedDeadLettersEveryEvent).
func TestAvroKeySchemaRefusedStops(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		autoRegister bool
		want         error
		says         string
	}{
		{"refused (409)", true, format.ErrRefused, "compatibility"},
		{"not registered", false, format.ErrNotRegistered, "register"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
				switch {
				case strings.Contains(r.URL.Path, "-key/versions"): // register: incompatible with the latest
					w.WriteHeader(http.StatusConflict)
					fmt.Fprint(w, `{"error_code":409,"message":"Schema being registered is incompatible with an earlier schema for subject"}`)
				case strings.Contains(r.URL.Path, "-key"): // look up: not under the subject
					w.WriteHeader(http.StatusNotFound)
					fmt.Fprint(w, `{"error_code":40403,"message":"Schema not found"}`)
				default:
					fmt.Fprint(w, `{"id":1}`)
				}
			}))
			defer srv.Close()
			reg, err := format.NewRegistry(format.RegistryConfig{URL: srv.URL, AutoRegister: c.autoRegister})
			if err != nil {
				t.Fatal(err)
			}
			kc := kafkatest.Start(t)
			s := newSink(t, kc, Config{KeyFormat: FormatAvro, Avro: format.NewAvroEncoder(reg)})
			e := newEvent("e0")
			e.AggregateID, e.AggregateIDType = "42", format.OIDInt8 // a bigint column, made NOT NULL since
			err = publish(t, s, e)
			if !failure.IsFatal(err) || !errors.Is(err, c.want) || !strings.Contains(err.Error(), "-key") || !strings.Contains(err.Error(), c.says) {
				t.Errorf("the registry refusing the topic's key schema: %v; want a fatal %v naming the subject <topic>-key and saying %q (walrelay stops), not each event dead-lettered", err, c.want, c.says)
			}
			col, _ := kafkatest.Collect(kc.Addrs(), `walrelay\.dlq`)
			defer col.Close()
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if recs, _ := col.Wait(ctx, func(r []*kgo.Record) bool { return len(r) > 0 }); len(recs) > 0 {
				t.Errorf("the event dead-lettered (%s: %.200s) because the registry refused the topic's key schema", kafkatest.Header(recs[0], HeaderReason), kafkatest.Header(recs[0], HeaderError))
			}
		})
	}
}
