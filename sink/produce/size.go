package produce

import "github.com/twmb/franz-go/pkg/kgo"

// RecordSize is what a record counts against the buffer limits: its key,
// value and headers, as the client counts it.
func RecordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// RequestCap is the largest produce request the clients write (for
// kgo.BrokerMaxWriteBytes): a batch of
// batchMax bytes and 64 KiB for the request's own fields (its header, the
// transactional id, the topic's name). The client encodes each request
// into a buffer of its size, grown by doubling, from a pool that each
// collection empties: with payloads that compression does not shrink, a
// request that held a 1 MB batch of each of four partitions took a 4 to 8
// MiB buffer, grown again after each collection, and near the soft memory
// limit these buffers and their growth were a quarter of the heap and a
// third of the CPU (docs/benchmarks.md). A round's partitions go in
// several requests instead, pipelined (up to five in flight to a broker);
// each partition's batch is still in one request.
func RequestCap(batchMax int32) int32 {
	return int32(min(int64(batchMax)+64<<10, 1<<30))
}

// BatchOverhead is at least what a record batch takes beyond its records:
// its header (61 bytes in the v2 format) and what a produce request adds
// around it.
const BatchOverhead = 128

// WireSize is at least what a record takes in a batch: RecordSize and, at
// most, the varints and fields around them (length, attributes, timestamp
// and offset deltas, key and value lengths, header count: 36 bytes; 10 per
// header), which also covers the older message format's 34 bytes of
// overhead.
func WireSize(r *kgo.Record) int {
	return RecordSize(r) + 36 + 10*len(r.Headers)
}
