package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/sink/record"
)

// SeedBrokers returns the seed brokers' addresses of the configuration
// (host:port), as given.
func (s *Sink) SeedBrokers() []string { return append([]string(nil), s.cfg.Brokers...) }

// Ping checks that a broker answers within ctx, and reads the broker's
// message.max.bytes and the dead-letter topic's limit. In exactly-once mode
// it also creates the offsets topic if it is missing, and refuses one of
// another shape; Resume starts the transactions.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.client().Ping(ctx); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return &closedError{msg: fmt.Sprintf("reach kafka brokers %s: %s", strings.Join(s.cfg.Brokers, ","), s.closedAtOnce(ctx)), err: err}
		}
		return fmt.Errorf("reach kafka brokers %s: %w", strings.Join(s.cfg.Brokers, ","), err)
	}
	if n, err := s.brokerLimit(ctx); err != nil {
		// Not fatal: a role may lack DescribeConfigs. The broker then
		// refuses what is too large, and that is dead-lettered.
		s.log.Warn("cannot read the broker's message.max.bytes; batches are capped by kafka.batch_max_bytes alone", "err", err)
	} else {
		s.brokerMax.Store(n)
	}
	s.topicInfoFor(ctx, s.cfg.DLQTopic)
	if s.tx != nil {
		return s.tx.EnsureOffsetsTopic(ctx)
	}
	return nil
}

// closedError is a broker closing the connection before it answered, told
// in walrelay's words; it wraps the client's error.
type closedError struct {
	msg string
	err error
}

func (e *closedError) Error() string { return e.msg }
func (e *closedError) Unwrap() error { return e.err }

// closedAtOnce says, for each configured broker, what it answers on a
// connection of its own: nothing (it closed or reset the connection before
// its first answer, as a listener that wants TLS does, and as a TCP proxy
// or load balancer whose backends are all down does), Kafka's API versions without Produce (a
// KRaft controller's listener), or API versions and then nothing (as a
// listener that wants SASL does).
func (s *Sink) closedAtOnce(ctx context.Context) string {
	tlsCfg := s.tlsCfg
	sasl := len(s.client().OptValues(kgo.SASL)) > 0 && s.client().OptValues(kgo.SASL)[0] != nil
	var seen []string
	for _, addr := range s.cfg.Brokers {
		seen = append(seen, addr+" "+probe(ctx, addr, tlsCfg, sasl))
	}
	return strings.Join(seen, "; ")
}

// probe asks the broker at addr for its API versions on a client of its own,
// over TLS if tlsCfg is not nil and without SASL (a listener answers API
// versions before authentication), and says what it saw.
func probe(ctx context.Context, addr string, tlsCfg *tls.Config, sasl bool) string {
	opts := []kgo.Opt{kgo.SeedBrokers(addr)}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Sprintf("could not be asked: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	switch {
	case err != nil && tlsCfg == nil:
		return "closed the connection before it answered its first request (api versions), as a listener that wants TLS does: kafka.tls.enabled is false (a TCP proxy or load balancer whose Kafka backends are all down closes the same way)"
	case err != nil:
		return fmt.Sprintf("did not answer its first request (api versions) over TLS: check kafka.tls.* against the listener (%v)", err)
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == int16(kmsg.Produce) {
			if sasl {
				return "answered its API versions, then closed the connection: check kafka.sasl.mechanism and the SASL credentials against the listener"
			}
			return "answered its API versions, then closed the connection, as a listener that wants SASL does: kafka.sasl.mechanism is empty"
		}
	}
	return "answers Kafka's protocol without Produce or Metadata, as a KRaft controller's listener (controller.listener.names) does: kafka.brokers must name the brokers' client listeners (their advertised.listeners)"
}

// brokerLimit reads message.max.bytes of a broker the client knows.
func (s *Sink) brokerLimit(ctx context.Context) (int32, error) {
	meta := kmsg.NewPtrMetadataRequest()
	meta.Topics = []kmsg.MetadataRequestTopic{}
	mresp, err := meta.RequestWith(ctx, s.client())
	if err != nil {
		return 0, fmt.Errorf("read metadata: %w", err)
	}
	if len(mresp.Brokers) == 0 {
		return 0, errors.New("the metadata names no broker")
	}
	return s.describeLimit(ctx, kmsg.ConfigResourceTypeBroker, strconv.Itoa(int(mresp.Brokers[0].NodeID)), "message.max.bytes")
}

// describeLimit reads one size setting of a broker or topic.
func (s *Sink) describeLimit(ctx context.Context, typ kmsg.ConfigResourceType, name, key string) (int32, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName, res.ConfigNames = typ, name, []string{key}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, s.client())
	if err != nil {
		return 0, fmt.Errorf("describe %s of %s: %w", key, name, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return 0, fmt.Errorf("describe %s of %s: %w", key, name, err)
		}
		for _, c := range r.Configs {
			if c.Name == key && c.Value != nil {
				n, err := strconv.ParseInt(*c.Value, 10, 32)
				if err != nil {
					return 0, fmt.Errorf("%s of %s: %q is not a size: %w", key, name, *c.Value, err)
				}
				return int32(n), nil
			}
		}
	}
	return 0, fmt.Errorf("describe %s of %s: not in the answer", key, name)
}

// topicInfo is what the sink learns of a topic at its first event.
type topicInfo struct {
	valid     bool  // a legal Kafka topic name
	forbidden error // why no event may go there (record.Builder.CheckTopic), nil if it may
	batchCap  int32 // the cap of its batches (batchCap)
	// inflight counts its records handed to the queue and not yet
	// answered: a topic forgotten with none is purged from the clients.
	inflight *atomic.Int64
}

// maxCachedTopics bounds the topics whose topicInfo is remembered: a
// stream has few, but a row chooses its topic, and rows with ever new
// aggregate types, legal names or not, must not grow the sink without end.
// Past it, one remembered topic is forgotten for each new one; a topic
// forgotten is learnt again (one request) at its next event.
const maxCachedTopics = 4096

// purgeBatch is how many forgotten topics are purged from the Kafka
// clients at once (forgetATopic). The topics remembered and those
// forgotten but not yet purged are at most maxCachedTopics together; a
// client's metadata request was seen naming up to maxCachedTopics + 52
// (requests made while a purge runs), never more than that and
// purgeBatch.
const purgeBatch = 64

// topicInfoFor returns what the sink knows of a topic, learning it at the topic's
// first event (a stream has few topics). A topic that no event may go to
// costs no request.
func (s *Sink) topicInfoFor(ctx context.Context, topic string) topicInfo {
	if ti, ok := s.topics.Load(topic); ok {
		return ti.(topicInfo)
	}
	// Learnt under forgetMu: a topic being forgotten and purged is not
	// learnt again (and produced to) until it is purged.
	s.forgetMu.Lock()
	defer s.forgetMu.Unlock()
	if ti, ok := s.topics.Load(topic); ok {
		return ti.(topicInfo)
	}
	delete(s.forgotten, topic) // not to be purged: it is used again
	ti := topicInfo{valid: record.ValidTopic(topic), batchCap: s.cfg.BatchMaxBytes, inflight: new(atomic.Int64)}
	if ti.valid {
		// The dead-letter topic's too: Ping learns its cap here, and no
		// event goes there by its route.
		ti.forbidden = s.records.CheckTopic(topic)
	}
	if ti.valid && (ti.forbidden == nil || topic == s.cfg.DLQTopic) {
		ti.batchCap = s.batchCap(ctx, topic)
		if v, ok := s.refused.LoadAndDelete(topic); ok && ti.batchCap >= v.(int32) {
			// The limit the broker enforces is lower than what could be
			// read: halve the cap, again at each refusal, until batches fit.
			ti.batchCap = max(v.(int32)/2, minBatchCap)
			s.log.Warn("the broker refused a batch for a topic whose lower limit could not be read; halving its batch cap", "topic", topic, "batch_cap", ti.batchCap)
		}
	}
	if int(s.topicsN.Load())+len(s.forgotten) >= maxCachedTopics {
		s.forgetATopic()
	}
	v, loaded := s.topics.LoadOrStore(topic, ti)
	if !loaded {
		s.topicsN.Add(1)
	}
	return v.(topicInfo)
}

// forgetATopic forgets one remembered topic other than the dead-letter
// topic, one without records in flight if it finds one, and purges the
// forgotten topics from the Kafka clients, purgeBatch at a time: a client
// remembers every topic it produced to, and names each in its metadata
// requests, so a topic forgotten by the sink alone would still grow them
// without end. A topic with records in flight is not purged until they are
// answered (purging would fail them). s.forgetMu is held: no record of a
// forgotten topic is produced until it is learnt again (holdTopic), and a
// topic learnt again is not purged.
func (s *Sink) forgetATopic() {
	var victim string
	var vi topicInfo
	s.topics.Range(func(k, v any) bool {
		if k.(string) == s.cfg.DLQTopic {
			return true
		}
		ti := v.(topicInfo)
		if victim == "" {
			victim, vi = k.(string), ti // if every topic has records in flight
		}
		if ti.inflight == nil || ti.inflight.Load() == 0 {
			victim, vi = k.(string), ti
			return false
		}
		return true
	})
	if victim == "" {
		return
	}
	if _, ok := s.topics.LoadAndDelete(victim); !ok {
		return
	}
	s.topicsN.Add(-1)
	if !vi.valid || vi.forbidden != nil || vi.inflight == nil {
		return // never produced to
	}
	// Purged in batches, a purge costing a round of each client's metadata
	// loop. A topic learnt again meanwhile leaves the batch (topicInfoFor).
	if s.forgotten == nil {
		s.forgotten = map[string]*atomic.Int64{}
	}
	s.forgotten[victim] = vi.inflight
	if len(s.forgotten) < purgeBatch {
		return
	}
	var purge []string
	for topic, n := range s.forgotten {
		// Checked after the delete: a record counted later sees the
		// topic gone and learns it again, under forgetMu (holdTopic).
		// A topic with records still in flight waits for a later batch.
		if n.Load() == 0 {
			purge = append(purge, topic)
			delete(s.forgotten, topic)
			s.counts.Delete(topic)
			s.partitions.Delete(topic)
		}
	}
	if len(purge) == 0 {
		return
	}
	s.client().PurgeTopicsFromClient(purge...)
	if s.lanes != nil {
		// each does not hold the lanes' lock while it calls f.
		s.lanes.Each(func(cl *kgo.Client) { cl.PurgeTopicsFromClient(purge...) })
	}
	for _, t := range purge {
		s.given.Delete(t)
	}
}

// holdTopic counts a record of topic in flight and returns ti's count to
// decrement when it is answered, or false if the topic was forgotten
// meanwhile (then the record must learn it again: topicInfoFor).
func (s *Sink) holdTopic(topic string, ti topicInfo) (*atomic.Int64, bool) {
	if ti.inflight == nil {
		return nil, true
	}
	ti.inflight.Add(1)
	if cur, ok := s.topics.Load(topic); !ok || cur.(topicInfo).inflight != ti.inflight {
		ti.inflight.Add(-1)
		return nil, false
	}
	return ti.inflight, true
}

// batchCapOf returns the batch cap learnt for a topic, or BatchMaxBytes if none
// was. It makes no request.
func (s *Sink) batchCapOf(topic string) int32 {
	if ti, ok := s.topics.Load(topic); ok {
		return ti.(topicInfo).batchCap
	}
	return s.cfg.BatchMaxBytes
}

// clientBatchCap is the clients' ProducerBatchMaxBytesFn: batchCapOf, also
// remembered as the smallest cap given for the topic. A client asks once per
// partition and keeps the answer, so a cap learnt again later (the topic
// forgotten by the cache, then its limit raised) is not the one it cuts
// batches at.
func (s *Sink) clientBatchCap(topic string) int32 {
	c := s.batchCapOf(topic)
	for {
		v, loaded := s.given.LoadOrStore(topic, c)
		if !loaded || v.(int32) <= c || s.given.CompareAndSwap(topic, v, c) {
			return c
		}
	}
}

// roundCapOf is the cap a round measures a partition's records against, so
// that it hands a client at most one of the client's batches between
// flushes: the smaller of the cap learnt and the smallest a client was
// given.
func (s *Sink) roundCapOf(topic string) int32 {
	c := s.batchCapOf(topic)
	if v, ok := s.given.Load(topic); ok && v.(int32) < c {
		return v.(int32)
	}
	return c
}

// batchCap reads the topic's max.message.bytes (or, for a topic not created
// yet, the broker's message.max.bytes) and returns it if it is below
// BatchMaxBytes, else BatchMaxBytes. It costs one request, made once per
// topic before its first record.
func (s *Sink) batchCap(ctx context.Context, topic string) int32 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	limit, err := s.describeLimit(ctx, kmsg.ConfigResourceTypeTopic, topic, "max.message.bytes")
	if err != nil {
		limit = s.brokerMax.Load() // a topic about to be auto-created gets the broker's default
		s.log.Debug("topic limit not read; using the broker's", "topic", topic, "limit", limit, "err", err)
	}
	c := s.cfg.BatchMaxBytes
	if limit >= 512 && limit < c {
		c = limit
		s.log.Info("batches capped at the topic's max.message.bytes, below kafka.batch_max_bytes", "topic", topic, "max_message_bytes", limit, "batch_max_bytes", s.cfg.BatchMaxBytes)
	}
	return c
}

// minBatchCap is the least cap halving gives a topic's batches.
const minBatchCap = 1024

// refusedBatch reports whether a too-large error for r is the broker
// refusing the batch r was in, not r itself: r fits in a batch of its own
// under the topic's cap (with room to spare for the batch's framing), so the
// client did not refuse it, and the limit the broker enforces is below the
// cap walrelay learnt.
func (s *Sink) refusedBatch(r *kgo.Record, err error) bool {
	if !errors.Is(err, kerr.MessageTooLarge) && !errors.Is(err, kerr.RecordListTooLarge) {
		return false
	}
	_, over := s.overCap(r)
	return !over
}

// overCap returns r's size with room to spare for a batch's framing
// (deadletter.Size, which a dead letter is cut to), and whether that is
// over its topic's batch cap: the client would refuse r.
func (s *Sink) overCap(r *kgo.Record) (int, bool) {
	size := deadletter.Size(r)
	return size, int64(size) > int64(s.batchCapOf(r.Topic))
}

// partitionCount returns topic's partition count, 0 if unknown (a topic
// not created yet). It reads it from the brokers at the topic's first
// placed event, and again whenever an event names a partition beyond the
// count known: partitions may have been added since.
func (s *Sink) partitionCount(ctx context.Context, topic string, partition int32) int32 {
	if n, ok := s.counts.Load(topic); ok && partition < n.(int32) {
		return n.(int32)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	resp, err := meta.RequestWith(ctx, s.client())
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		return 0 // unknown: the client refuses a partition out of range
	}
	n := int32(len(resp.Topics[0].Partitions))
	s.counts.Store(topic, n)
	return n
}

// CheckBrokers refuses a seed broker that is not host:port (or a host):
// one with credentials (user:pw@host:9092, token@host) or a URL
// (kafka://host:9092). franz-go dials such an entry as a host name and
// prints it in every dial error, password and all; the error names the
// entry by its position, never its text. Credentials go in SASL.
func CheckBrokers(brokers []string) error {
	for i, b := range brokers {
		switch {
		case strings.Contains(b, "@"):
			return fmt.Errorf("entry %d holds credentials (user@ or user:password@), which dial errors would print: want host:port, the credentials in SASL", i+1)
		case strings.Contains(b, "/"):
			return fmt.Errorf("entry %d: want host:port, not a URL", i+1)
		}
	}
	return nil
}
