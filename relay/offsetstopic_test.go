package relay_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/syncbuf"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
)

// TestStartWaitsForTheOffsetsTopic: an exactly-once start whose offsets
// topic the cluster cannot create yet (INVALID_REPLICATION_FACTOR, as a
// KRaft cluster answers while one of three brokers restarts), or does not
// show in the metadata yet after its creation (LEADER_NOT_AVAILABLE),
// waits, saying why, and starts once the cluster can. Before, the start
// failed at once, and after 5 s of the topic not in the metadata.
func TestStartWaitsForTheOffsetsTopic(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		key    kmsg.Key
		answer func(kmsg.Request) kmsg.Response
	}{
		{"INVALID_REPLICATION_FACTOR", kmsg.CreateTopics, func(req kmsg.Request) kmsg.Response {
			r := req.(*kmsg.CreateTopicsRequest)
			resp := r.ResponseKind().(*kmsg.CreateTopicsResponse)
			for _, tp := range r.Topics {
				rt := kmsg.NewCreateTopicsResponseTopic()
				rt.Topic, rt.ErrorCode = tp.Topic, kerr.InvalidReplicationFactor.Code
				resp.Topics = append(resp.Topics, rt)
			}
			return resp
		}},
		{"not in the metadata", kmsg.Metadata, func(req kmsg.Request) kmsg.Response {
			r := req.(*kmsg.MetadataRequest)
			if len(r.Topics) != 1 || r.Topics[0].Topic == nil || *r.Topics[0].Topic != "walrelay.offsets" {
				return nil
			}
			resp := r.ResponseKind().(*kmsg.MetadataResponse)
			rt := kmsg.NewMetadataResponseTopic()
			rt.Topic, rt.ErrorCode = r.Topics[0].Topic, kerr.LeaderNotAvailable.Code
			resp.Topics = append(resp.Topics, rt)
			return resp
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			kc := kafkatest.Start(t)
			s, err := sink.New(sink.Config{Brokers: kc.Addrs(), Transactions: &sink.Transactions{ID: "start", Key: "slot_a", Source: "db"}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const window = 7 * time.Second
			began := time.Now()
			kc.ControlKey(int16(c.key), func(req kmsg.Request) (kmsg.Response, error, bool) {
				if time.Since(began) > window {
					return nil, nil, false
				}
				kc.KeepControl()
				resp := c.answer(req)
				return resp, nil, resp != nil
			})
			var logs syncbuf.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			if err := relay.WaitForBrokers(t.Context(), s, log); err != nil {
				t.Fatalf("the start failed after %s: %v", time.Since(began).Round(time.Millisecond), err)
			}
			if took := time.Since(began); took < window || !strings.Contains(logs.String(), "offsets topic") {
				t.Fatalf("the start went on after %s, within the %s the topic was not ready, or did not say why it waited:\n%s", took, window, logs.String())
			}
		})
	}
}
