package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// readTopics reads topics from the first offsets at or after since (the
// start when zero) to their ends as of the call, with read_committed
// isolation, and calls fn for each record. opts are the client's options
// (brokers, TLS, SASL).
func readTopics(ctx context.Context, opts []kgo.Opt, topics []string, since time.Time, fn func(*kgo.Record) error) error {
	if len(topics) == 0 {
		return nil
	}
	admin, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("list the end offsets of %v: %w", topics, err)
	}
	var starts kadm.ListedOffsets
	if since.IsZero() {
		starts, err = adm.ListStartOffsets(ctx, topics...)
	} else {
		starts, err = adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
	}
	if err != nil {
		return fmt.Errorf("list the offsets of %v at %s: %w", topics, since.Format(time.RFC3339), err)
	}
	from := map[string]map[int32]kgo.Offset{}
	left := map[string]map[int32]int64{} // the end offset still to reach
	var missingTopic error
	ends.Each(func(o kadm.ListedOffset) {
		if errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
			return // a topic never written: nothing on it
		}
		if o.Err != nil {
			if missingTopic == nil {
				missingTopic = fmt.Errorf("topic %s partition %d: %w", o.Topic, o.Partition, o.Err)
			}
			return
		}
		s, ok := starts.Lookup(o.Topic, o.Partition)
		if !ok || s.Err != nil || s.Offset >= o.Offset {
			return // nothing to read
		}
		if from[o.Topic] == nil {
			from[o.Topic], left[o.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		from[o.Topic][o.Partition] = kgo.NewOffset().At(s.Offset)
		left[o.Topic][o.Partition] = o.Offset
	})
	if missingTopic != nil {
		return missingTopic
	}
	if len(from) == 0 {
		return nil
	}
	// Small fetches, one at a time: compressed batches of repetitive
	// payloads inflate tenfold in memory, and a window of millions must
	// read in bounded memory.
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...), kgo.ConsumePartitions(from), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxBytes(256<<10), kgo.FetchMaxPartitionBytes(256<<10), kgo.MaxConcurrentFetches(1))...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	remaining := 0
	for _, ps := range left {
		remaining += len(ps)
	}
	// A partition is done once a record at or past its end offset's
	// predecessor came; one that ends with transaction markers (control
	// records take offsets and are never returned) or aborted records is
	// done when nothing more comes for idleEnd.
	const idleEnd = 2 * time.Second
	idleSince := time.Now()
	for remaining > 0 && time.Since(idleSince) < idleEnd {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(topic string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("read %s partition %d: %w", topic, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var cbErr error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			end, ok := left[p.Topic][p.Partition]
			if !ok || len(p.Records) == 0 {
				return
			}
			idleSince = time.Now()
			for _, r := range p.Records {
				if r.Offset >= end {
					break
				}
				if cbErr == nil {
					cbErr = fn(r)
				}
			}
			if p.Records[len(p.Records)-1].Offset+1 >= end {
				delete(left[p.Topic], p.Partition)
				remaining--
			}
		})
		if cbErr != nil {
			return cbErr
		}
	}
	return nil
}
