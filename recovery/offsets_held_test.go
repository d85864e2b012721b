package recovery

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// refuseEarliest has the broker answer the earliest offset of partition 0
// of every ListOffsets with OFFSET_NOT_AVAILABLE (a new leader whose high
// watermark is not known yet) while refusing is true.
func refuseEarliest(kc *kafkatest.Cluster, refusing *atomic.Bool) {
	kc.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		r := req.(*kmsg.ListOffsetsRequest)
		if !refusing.Load() {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, tp := range r.Topics {
			for _, p := range tp.Partitions {
				if p.Timestamp != -2 {
					return nil, nil, false // not a start offsets request
				}
			}
			rt := kmsg.NewListOffsetsResponseTopic()
			rt.Topic = tp.Topic
			for _, p := range tp.Partitions {
				rp := kmsg.NewListOffsetsResponseTopicPartition()
				rp.Partition, rp.Offset, rp.Timestamp = p.Partition, 0, -1
				if p.Partition == 0 {
					rp.ErrorCode, rp.Offset = kerr.OffsetNotAvailable.Code, -1
				}
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
}

// TestReadTopicsWaitsOutAnOffsetNotAvailable: a partition whose start
// offset the broker answers with OFFSET_NOT_AVAILABLE for a while is asked
// again, and every record is read; one answered so for longer than the
// retry fails the read, naming the partition. Before, the partition was
// taken as empty: 44 of 60 records and no error, and reconcile would
// count its rows missing and send them again.
func TestReadTopicsWaitsOutAnOffsetNotAvailable(t *testing.T) {
	kc := kafkatest.Start(t)
	produce(t, kc, "orders", 60)
	var refusing atomic.Bool
	refusing.Store(true)
	refuseEarliest(kc, &refusing)
	time.AfterFunc(time.Second, func() { refusing.Store(false) })
	read := func() (int, error) {
		n := 0
		err := readTopics(t.Context(), []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...)}, []string{"orders"}, time.Time{}, func(*kgo.Record) error { n++; return nil })
		return n, err
	}
	if n, err := read(); err != nil || n != 60 {
		t.Fatalf("a start offset not available for 1 s: read %d of 60 records, %v", n, err)
	}
	refusing.Store(true)
	defer func(was time.Duration) { offsetsRetry = was }(offsetsRetry)
	offsetsRetry = time.Second
	if n, err := read(); err == nil || !strings.Contains(err.Error(), "partition 0") {
		t.Fatalf("a start offset never available: read %d records, error %v; want an error naming partition 0", n, err)
	}
}
