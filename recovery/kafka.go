package recovery

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/backoff"
	"github.com/walrelay/walrelay/sink"
)

// readTopics reads topics from the first offsets at or after since (the
// start when zero) to their ends as of the call, with read_committed
// isolation, and calls fn for each record. opts are the client's options
// (brokers, TLS, SASL).
func readTopics(ctx context.Context, opts []kgo.Opt, topics []string, since time.Time, fn func(*kgo.Record) error) error {
	return readTopicsStall(ctx, readStall, opts, topics, since, fn)
}

// offsetsRetry is how long readTopics asks again for offsets that a
// partition answered with an error a healthy cluster gives for a while
// (sink.Held: OFFSET_NOT_AVAILABLE from a new leader, LEADER_NOT_AVAILABLE,
// UNKNOWN_SERVER_ERROR), before it fails the read naming the partition.
var offsetsRetry = 30 * time.Second

// listOffsets lists the end offsets of topics and the offsets to read
// from (the start, or the first at or after since). A partition whose
// offsets were answered with a held error is asked again, with backoff,
// for offsetsRetry: a partition left out would read as empty, and
// reconcile count its rows as missing.
func listOffsets(ctx context.Context, adm *kadm.Client, topics []string, since time.Time) (ends, starts kadm.ListedOffsets, err error) {
	deadline := time.Now().Add(offsetsRetry)
	for try := 0; ; try++ {
		ends, err = adm.ListEndOffsets(ctx, topics...)
		if err != nil {
			return nil, nil, fmt.Errorf("list the end offsets of %v: %w", topics, err)
		}
		if since.IsZero() {
			starts, err = adm.ListStartOffsets(ctx, topics...)
		} else {
			starts, err = adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("list the offsets of %v at %s: %w", topics, since.Format(time.RFC3339), err)
		}
		held := false
		for _, l := range []kadm.ListedOffsets{ends, starts} {
			l.Each(func(o kadm.ListedOffset) { held = held || sink.Held(o.Err) })
		}
		if !held || time.Now().After(deadline) {
			return ends, starts, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(backoff.Wait(100*time.Millisecond, 2*time.Second, try)):
		}
	}
}

// readTopicsStall is readTopics failing when no partition moved for stall.
func readTopicsStall(ctx context.Context, stall time.Duration, opts []kgo.Opt, topics []string, since time.Time, fn func(*kgo.Record) error) error {
	if len(topics) == 0 {
		return nil
	}
	admin, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	// Closed before the reader is made: a hook in opts that registers
	// metrics for each client it sees created (kprom) sees one at a time.
	closeAdmin := sync.OnceFunc(admin.Close)
	defer closeAdmin()
	adm := kadm.NewClient(admin)
	ends, starts, err := listOffsets(ctx, adm, topics, since)
	if err != nil {
		return err
	}
	from := map[string]map[int32]kgo.Offset{}
	left := map[string]map[int32]*span{} // the partitions still to read to their end
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
		if ok && s.Err != nil && missingTopic == nil {
			missingTopic = fmt.Errorf("topic %s partition %d: the offset to read from: %w", o.Topic, o.Partition, s.Err)
		}
		if !ok || s.Err != nil || s.Offset >= o.Offset {
			return // nothing to read (or the error above)
		}
		if from[o.Topic] == nil {
			from[o.Topic], left[o.Topic] = map[int32]kgo.Offset{}, map[int32]*span{}
		}
		from[o.Topic][o.Partition] = kgo.NewOffset().At(s.Offset)
		left[o.Topic][o.Partition] = &span{next: s.Offset, end: o.Offset}
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
	// Control records (transaction markers) are kept: they take offsets, so
	// a partition that ends with one, or with an aborted transaction (whose
	// abort marker comes after it), is seen to reach its end.
	closeAdmin()
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...), kgo.ConsumePartitions(from), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), kgo.FetchMaxBytes(256<<10), kgo.FetchMaxPartitionBytes(256<<10), kgo.MaxConcurrentFetches(1))...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	remaining := 0
	for _, ps := range left {
		remaining += len(ps)
	}
	// A partition is done once the record before its end offset came. The
	// read fails, naming what it did not read, only when no partition
	// moved for stall: a slow cluster is waited for.
	progress := time.Now()
	for remaining > 0 {
		if time.Since(progress) >= stall {
			return fmt.Errorf("read %v: nothing came for %s, and %s not read to its end (a broker down, or a transaction still open): nothing was decided on a partial read",
				topics, stall, unread(left))
		}
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %v (%s not read to its end): %w", topics, unread(left), err)
		}
		var ferr error
		fs.EachError(func(topic string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !kerr.IsRetriable(err) {
				ferr = fmt.Errorf("read %s partition %d: %w", topic, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var cbErr error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			sp, ok := left[p.Topic][p.Partition]
			if !ok || len(p.Records) == 0 {
				return
			}
			progress = time.Now()
			for _, r := range p.Records {
				if r.Offset >= sp.end {
					break
				}
				sp.next = r.Offset + 1
				if cbErr == nil && !r.Attrs.IsControl() {
					cbErr = fn(r)
				}
			}
			if p.Records[len(p.Records)-1].Offset+1 >= sp.end {
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

// readStall is how long readTopics waits for any partition to move before
// it fails.
const readStall = 2 * time.Minute

// span is what is left to read of a partition: from next to end.
type span struct{ next, end int64 }

// unread names the partitions of left not read to their end, with the
// offset reached and the end.
func unread(left map[string]map[int32]*span) string {
	var parts []string
	for t, ps := range left {
		for p, sp := range ps {
			parts = append(parts, fmt.Sprintf("%s partition %d (at offset %d of %d)", t, p, sp.next, sp.end))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// trimmedTopics says, for each of topics, why a record of a row may be gone
// from it though it was published: a compacted topic (cleanup.policy
// compact) keeps only the latest record of a key, and a partition whose log
// starts after offset 0 lost the records before it (retention, a
// deletion). Which times those records had is not known, whatever since
// is: a record is stamped with its event's time, not the time it was
// published, so a partition's timestamps are not in offset order (a row
// published late, a replay, dlq replay), and an event of the window can sit
// before records stamped earlier than it. reconcile would count such a row
// missing. A topic that does not exist has nothing to say. since only
// names the window in the notes.
func trimmedTopics(ctx context.Context, opts []kgo.Opt, topics []string, since time.Time) ([]string, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var notes []string
	cfgs, err := adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("describe the configs of %v: %w", topics, err)
	}
	for _, rc := range cfgs {
		if rc.Err != nil {
			continue // an unknown topic: nothing on it
		}
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && c.Value != nil && strings.Contains(*c.Value, "compact") {
				notes = append(notes, fmt.Sprintf("topic %s has cleanup.policy=%s: a record superseded by a later one of its key is gone, so its row counts as missing, and replaying it would make an old event its key's latest value", rc.Name, *c.Value))
			}
		}
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list the start offsets of %v: %w", topics, err)
	}
	window := "the window"
	if !since.IsZero() {
		window = "the window from " + since.UTC().Format(time.RFC3339)
	}
	var trimmed []string
	starts.Each(func(o kadm.ListedOffset) {
		if o.Err != nil || o.Offset <= 0 {
			return
		}
		trimmed = append(trimmed, fmt.Sprintf("topic %s partition %d starts at offset %d: the records before it are gone (retention, or a deletion), and their times are unknown (timestamps are not in offset order), so rows of %s published there count as missing", o.Topic, o.Partition, o.Offset, window))
	})
	sort.Strings(trimmed)
	return append(notes, trimmed...), nil
}
