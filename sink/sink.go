package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/backoff"
)

// Config configures a Sink. Zero values mean the defaults.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID is the Kafka client id. Default "walrelay".
	ClientID string
	// Topic is the topic template: {aggregatetype} and {type} are replaced
	// by the event's values. Default "outbox.event.{aggregatetype}".
	Topic string
	// DLQTopic receives events that cannot be published. Default
	// "walrelay.dlq".
	DLQTopic string
	// Compression is none, gzip, snappy, lz4 or zstd. Default lz4.
	Compression string
	// Linger is how long the sink, with nothing in flight, waits for more
	// records before it sends what it has. Default 5ms; negative sends at
	// once.
	Linger time.Duration
	// BatchMaxBytes caps one record batch; a record larger than this is
	// dead-lettered. Default 1000012, Kafka's default max.message.bytes. A
	// topic whose max.message.bytes (or the broker's message.max.bytes) is
	// lower gets that lower cap: the broker would refuse a whole batch over
	// it, small records and all.
	BatchMaxBytes int32
	// MaxBufferedRecords and MaxBufferedBytes bound what is published and
	// not yet acknowledged: half for the records in flight, half for those
	// queued behind them; Publish blocks beyond them. Defaults 5000 and
	// 16 MiB. A single record larger than half is let in alone.
	MaxBufferedRecords int
	MaxBufferedBytes   int
	// DisableAutoCreateTopics stops the client from asking the broker to
	// create missing topics. By default it asks (the broker must allow it).
	DisableAutoCreateTopics bool
	// Logger receives lifecycle logs and the client's warnings. Nil discards.
	Logger *slog.Logger
	// Opts are extra client options (TLS, SASL), applied last.
	Opts []kgo.Opt
}

// Sink produces events. Its methods are safe for concurrent use.
type Sink struct {
	cfg       Config
	cl        *kgo.Client
	q         *queue        // the next round (rounds.go)
	stop      func()        // ends the flusher's wait for a round
	flushed   chan struct{} // closed when the flusher returns
	log       *slog.Logger
	parts     []string     // the template split at its placeholders: text, placeholder, text, …
	topics    sync.Map     // topic name -> topicInfo, learnt at its first event
	refused   sync.Map     // topic name -> the batch cap (int32) at which the broker refused a batch
	suspects  suspects     // events failed by a refusal of their whole batch: send them alone
	brokerMax atomic.Int32 // the broker's message.max.bytes; 0 until Ping read it
	dataLoss  atomic.Uint64

	mu   sync.Mutex // guards the header cache
	last txnHeaders
}

// txnHeaders are the header values shared by every event of a transaction,
// formatted once, and the Kafka timestamp of its records.
type txnHeaders struct {
	lsn                        pglogrepl.LSN
	xid                        uint32
	lsnText, xidText, timeText []byte
	// stamp is the records' timestamp: the clock read once per transaction
	// and again every stampEvery records of a large one, rather than once
	// per record as the client would (a clock read is 8% of walrelay's CPU
	// while it catches up). Kafka timestamps are milliseconds.
	stamp time.Time
	uses  int
}

const stampEvery = 256

var topicRe = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// ValidTopic reports whether name is a legal Kafka topic name.
func ValidTopic(name string) bool { return topicRe.MatchString(name) && name != "." && name != ".." }

// New checks cfg, fills its defaults and creates the client. It does not
// contact the brokers; Ping does.
func New(cfg Config) (*Sink, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka brokers: none configured")
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "walrelay"
	}
	if cfg.Topic == "" {
		cfg.Topic = "outbox.event.{aggregatetype}"
	}
	if cfg.DLQTopic == "" {
		cfg.DLQTopic = "walrelay.dlq"
	}
	if !ValidTopic(cfg.DLQTopic) {
		return nil, fmt.Errorf("dead-letter topic %q is not a valid Kafka topic name", cfg.DLQTopic)
	}
	probe := strings.NewReplacer("{aggregatetype}", "x", "{type}", "x").Replace(cfg.Topic)
	if strings.ContainsAny(probe, "{}") || !ValidTopic(probe) {
		return nil, fmt.Errorf("topic template %q: only {aggregatetype} and {type} may be replaced, and the rest must be legal in a topic name", cfg.Topic)
	}
	if cfg.Linger == 0 {
		cfg.Linger = 5 * time.Millisecond
	}
	if cfg.BatchMaxBytes == 0 {
		cfg.BatchMaxBytes = 1000012
	}
	if cfg.MaxBufferedRecords == 0 {
		cfg.MaxBufferedRecords = 5000
	}
	if cfg.MaxBufferedBytes == 0 {
		cfg.MaxBufferedBytes = 16 << 20
	}
	if int64(cfg.MaxBufferedBytes) < int64(cfg.BatchMaxBytes) {
		return nil, fmt.Errorf("max buffered bytes %d is below batch max bytes %d: a large record could never be buffered", cfg.MaxBufferedBytes, cfg.BatchMaxBytes)
	}
	codecOpt, err := compression(cfg.Compression)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "sink")
	s := &Sink{cfg: cfg, log: log, parts: splitTemplate(cfg.Topic)}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2, as the Java client
		codecOpt,
		// The flusher sends rounds (rounds.go); the client sends nothing
		// on its own.
		kgo.ManualFlushing(),
		// Asked once per partition, after Publish learnt the topic.
		kgo.ProducerBatchMaxBytesFn(s.capOf),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		kgo.MaxBufferedBytes(cfg.MaxBufferedBytes),
		// Retry sooner than the client's default (250ms doubling to 5s):
		// every retry holds the slot's position back.
		kgo.RetryBackoffFn(func(fails int) time.Duration { return backoff.Wait(50*time.Millisecond, time.Second, fails-1) }),
		kgo.WithLogger(slogAdapter{log}),
		// The broker answered OUT_OF_ORDER_SEQUENCE_NUMBER or
		// UNKNOWN_PRODUCER_ID: records it had acknowledged may be gone.
		// The client goes on with a new producer id; the sink fails what
		// is queued, so that the stream restarts from its confirmed
		// position.
		kgo.ProducerOnDataLossDetected(s.lostData),
	}
	if !cfg.DisableAutoCreateTopics {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	opts = append(opts, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	s.cl = cl
	s.q = newQueue(cfg)
	s.flushed = make(chan struct{})
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go s.flush(ctx)
	return s, nil
}

// ErrDataLoss breaks the sink when the client detects that the broker may
// have lost records it had acknowledged.
var ErrDataLoss = errors.New("the broker may have lost acknowledged records (out of order sequence or unknown producer id)")

func (s *Sink) lostData(topic string, partition int32) {
	s.q.breakOn(fmt.Errorf("%w: topic %s partition %d", ErrDataLoss, topic, partition))
	s.dataLoss.Add(1)
	s.log.Error("the producer detected data loss: the broker may have lost records it had acknowledged; restarting from the confirmed position",
		"topic", topic, "partition", partition)
}

// DataLosses returns how many times the client detected data loss.
func (s *Sink) DataLosses() uint64 { return s.dataLoss.Load() }

// compression returns the client option for a codec name.
func compression(name string) (kgo.Opt, error) {
	switch name {
	case "", "lz4":
		return kgo.WithCompressor(newLz4Compressor()), nil
	case "none":
		return kgo.ProducerBatchCompression(kgo.NoCompression()), nil
	case "gzip":
		return kgo.ProducerBatchCompression(kgo.GzipCompression()), nil
	case "snappy":
		return kgo.ProducerBatchCompression(kgo.SnappyCompression()), nil
	case "zstd":
		return kgo.ProducerBatchCompression(kgo.ZstdCompression()), nil
	}
	return nil, fmt.Errorf("compression %q: want none, gzip, snappy, lz4 or zstd", name)
}

// Ping checks that a broker answers within ctx, and reads the broker's
// message.max.bytes and the dead-letter topic's limit.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.cl.Ping(ctx); err != nil {
		err = fmt.Errorf("reach kafka brokers %s: %w", strings.Join(s.cfg.Brokers, ","), err)
		if errors.Is(err, io.EOF) {
			// A broker that closes the connection at once: a TLS listener
			// reached without TLS, or a SASL handshake it refused (Apache
			// Kafka answers SASL_AUTHENTICATION_FAILED, which says so
			// itself; some brokers, kfake among them, just close).
			err = fmt.Errorf("%w (the broker closed the connection: check whether its listener wants TLS (kafka.tls.enabled) and SASL (kafka.sasl.mechanism), and the SASL credentials)", err)
		}
		return err
	}
	if n, err := s.brokerLimit(ctx); err != nil {
		// Not fatal: a role may lack DescribeConfigs. The broker then
		// refuses what is too large, and that is dead-lettered.
		s.log.Warn("cannot read the broker's message.max.bytes; batches are capped by kafka.batch_max_bytes alone", "err", err)
	} else {
		s.brokerMax.Store(n)
	}
	s.learn(ctx, s.cfg.DLQTopic)
	return nil
}

// brokerLimit reads message.max.bytes of a broker the client knows.
func (s *Sink) brokerLimit(ctx context.Context) (int32, error) {
	meta := kmsg.NewPtrMetadataRequest()
	meta.Topics = []kmsg.MetadataRequestTopic{}
	mresp, err := meta.RequestWith(ctx, s.cl)
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
	resp, err := req.RequestWith(ctx, s.cl)
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
	valid    bool  // a legal Kafka topic name
	batchCap int32 // the cap of its batches (batchCap)
}

// learn returns what the sink knows of a topic, learning it at the topic's
// first event (a stream has few topics).
func (s *Sink) learn(ctx context.Context, topic string) topicInfo {
	if ti, ok := s.topics.Load(topic); ok {
		return ti.(topicInfo)
	}
	ti := topicInfo{valid: ValidTopic(topic), batchCap: s.cfg.BatchMaxBytes}
	if ti.valid {
		ti.batchCap = s.batchCap(ctx, topic)
		if v, ok := s.refused.LoadAndDelete(topic); ok && ti.batchCap >= v.(int32) {
			// The limit the broker enforces is lower than what could be
			// read: halve the cap, again at each refusal, until batches fit.
			ti.batchCap = max(v.(int32)/2, minBatchCap)
			s.log.Warn("the broker refused a batch for a topic whose lower limit could not be read; halving its batch cap", "topic", topic, "batch_cap", ti.batchCap)
		}
	}
	v, _ := s.topics.LoadOrStore(topic, ti)
	return v.(topicInfo)
}

// capOf returns the batch cap learnt for a topic, or BatchMaxBytes if none
// was. It makes no request.
func (s *Sink) capOf(topic string) int32 {
	if ti, ok := s.topics.Load(topic); ok {
		return ti.(topicInfo).batchCap
	}
	return s.cfg.BatchMaxBytes
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

// Abort fails every record not yet sent and waits, within ctx, for those in
// flight to be answered; every callback has run when it returns nil, and
// the sink sends again. After a publish failure the caller calls it before
// it publishes the failed record again. A topic whose batch the broker
// refused as too large is then forgotten, so that its limit is read again
// before its next record.
func (s *Sink) Abort(ctx context.Context) error {
	if err := s.q.abort(ctx, s.cl); err != nil {
		return err
	}
	var stale []string
	s.refused.Range(func(k, _ any) bool {
		if _, ok := s.topics.LoadAndDelete(k); ok {
			stale = append(stale, k.(string))
		}
		return true
	})
	if len(stale) > 0 {
		// The client asks ProducerBatchMaxBytesFn once per partition:
		// purging the topics makes it ask again.
		s.cl.PurgeTopicsFromClient(stale...)
	}
	return nil
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
	size := 256 + len(r.Topic) + recordSize(r) + 10*len(r.Headers)
	return int64(size) <= int64(s.capOf(r.Topic))
}

// Close closes the client; records not yet acknowledged are failed.
func (s *Sink) Close() {
	s.q.close()
	s.stop()
	<-s.flushed
	s.cl.Close()
}

// splitTemplate splits a topic template into literal text at even indexes
// and placeholders at odd ones.
func splitTemplate(t string) []string {
	var parts []string
	for {
		i := strings.IndexByte(t, '{')
		j := strings.IndexByte(t, '}')
		if i < 0 || j < i {
			return append(parts, t)
		}
		parts = append(parts, t[:i], t[i:j+1])
		t = t[j+1:]
	}
}

// Topic returns the topic an event is routed to.
func (s *Sink) Topic(e *decoder.Event) string {
	if len(s.parts) == 1 {
		return s.parts[0]
	}
	if len(s.parts) == 3 && s.parts[2] == "" {
		// The common shape, prefix{placeholder}: one concatenation.
		return s.parts[0] + s.field(s.parts[1], e)
	}
	var b strings.Builder
	for i, p := range s.parts {
		if i%2 == 0 {
			b.WriteString(p)
		} else {
			b.WriteString(s.field(p, e))
		}
	}
	return b.String()
}

func (s *Sink) field(placeholder string, e *decoder.Event) string {
	if placeholder == "{type}" {
		return e.Type
	}
	return e.AggregateType
}

// Delivery says where Kafka acknowledged an event.
type Delivery struct {
	Topic string
	// Partition is the record's partition, or -1 if it was never assigned
	// one (it failed before the client buffered it).
	Partition int32
	// DeadLetter is empty when the event went to its topic, else the reason
	// it went to the dead-letter topic (see HeaderReason).
	DeadLetter string
}

// Done is called once per published event, from the client's callback
// goroutine or the sink's (or, if Publish gives up waiting, from Publish); it
// must not block. A nil error means Kafka acknowledged the
// event on its topic or on the dead-letter topic, as d says.
type Done func(d Delivery, err error)

// Publish produces e and calls done with its fate. It blocks while the sink
// holds MaxBufferedRecords or MaxBufferedBytes; ctx bounds that wait and,
// once cancelled, fails the record if it is not yet sent when its round
// goes (a record already sent is answered). After a failure that fails the
// records behind it (anything but a dead-lettered event), every record
// published until Abort fails with ErrNotSent, unsent.
func (s *Sink) Publish(ctx context.Context, e *decoder.Event, done Done) {
	if e.Invalid != nil {
		s.deadLetter(ctx, e, "invalid_event", "", e.Invalid, done)
		return
	}
	topic := s.Topic(e)
	if !s.learn(ctx, topic).valid {
		s.deadLetter(ctx, e, "invalid_topic", topic, fmt.Errorf("topic %q from template %q is not a valid Kafka topic name", topic, s.cfg.Topic), done)
		return
	}
	h, stamp := s.headers(e, 0)
	// Partition -1 until the client assigns one: a record failed before that
	// was never buffered.
	r := &kgo.Record{Topic: topic, Partition: -1, Key: readOnly(e.AggregateID), Value: e.Payload, Headers: h, Timestamp: stamp}
	// An event whose batch the broker refused goes in a request of its own,
	// so that the broker's answer is about it alone.
	alone := s.suspects.has(e.WALStart)
	s.q.push(ctx, r, alone, func(r *kgo.Record, err error) {
		switch {
		case err == nil:
			if alone {
				s.suspects.clear(e.WALStart)
			}
			done(Delivery{Topic: topic, Partition: r.Partition}, nil)
		case s.refusedBatch(r, err):
			s.q.breakOn(err)
			// Transient: the stream restarts, Abort forgets the topic, and
			// the resent records go in batches under the limit read again.
			if _, loaded := s.refused.LoadOrStore(topic, s.capOf(topic)); !loaded {
				s.log.Warn("the broker refused a batch as too large: the topic's max.message.bytes must be below the cap walrelay read; reading it again", "topic", topic, "err", err)
			}
			done(Delivery{Topic: topic, Partition: r.Partition}, fmt.Errorf("publish event %s to %s: the broker refused its batch: %w", e.ID, topic, err))
		case refusesBatch(err) && !alone:
			// The broker refused the batch for one record of it, or the
			// client failed the partition's records behind it: which one is
			// unknown. Transient: once the stream restarts, this event goes
			// alone, and only a record refused alone is dead-lettered.
			s.q.breakOn(err)
			s.suspects.add(e.WALStart)
			done(Delivery{Topic: topic, Partition: r.Partition}, fmt.Errorf("publish event %s to %s: the broker refused its batch (sent again alone): %w", e.ID, topic, err))
		case perEvent(err):
			s.suspects.clear(e.WALStart)
			// The promise must not block on the client: dead-letter from a
			// goroutine of its own. This is the rare path.
			go s.deadLetter(ctx, e, reason(err), topic, err, done)
		default:
			s.q.breakOn(err)
			done(Delivery{Topic: topic, Partition: r.Partition}, fmt.Errorf("publish event %s to %s: %w", e.ID, topic, err))
		}
	})
}

// suspects are the WAL positions of events whose batch the broker refused
// for what may be one record of it. It is empty but for the rare restart
// after such a refusal: has costs one atomic load then.
type suspects struct {
	n   atomic.Int64
	mu  sync.Mutex
	set map[pglogrepl.LSN]struct{}
}

func (x *suspects) has(at pglogrepl.LSN) bool {
	if x.n.Load() == 0 {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.set[at]
	return ok
}

func (x *suspects) add(at pglogrepl.LSN) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.set == nil {
		x.set = map[pglogrepl.LSN]struct{}{}
	}
	x.set[at] = struct{}{}
	x.n.Store(int64(len(x.set)))
}

func (x *suspects) clear(at pglogrepl.LSN) {
	if x.n.Load() == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.set, at)
	x.n.Store(int64(len(x.set)))
}

// refusesBatch reports whether err is a broker's refusal that fails a whole
// batch, and the client's other records of the partition with it, for what
// may be one record of it: an invalid record (a compacted topic's null key,
// a broker-side validation), a corrupt batch, an invalid topic.
func refusesBatch(err error) bool {
	return errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) || errors.Is(err, kerr.InvalidTopicException)
}

// Fatal reports whether a publish error is one that retrying cannot fix:
// authorization refused, or a topic that does not exist and is not created.
// Other errors are transient: the caller retries the event (walrelay does so
// by restarting the stream from the last confirmed position).
func Fatal(err error) bool {
	for _, e := range []error{kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.SaslAuthenticationFailed,
		kerr.UnknownTopicOrPartition, kerr.UnknownTopicID, kerr.InvalidRequiredAcks, kerr.UnsupportedVersion} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Persistent reports whether a publish error is a broker's refusal that
// Kafka does not call retriable and that the sink does not answer by sending
// differently (a batch refused as too large, or for one record of it): a
// refusal that may well come again, every time (POLICY_VIOLATION,
// UNSUPPORTED_COMPRESSION_TYPE). The caller restarts, and gives up after a
// few in a row without progress.
func Persistent(err error) bool {
	var ke *kerr.Error
	if !errors.As(err, &ke) || ke.Retriable || errors.Is(err, ErrNotSent) {
		return false
	}
	return !refusesBatch(err) && !errors.Is(err, kerr.MessageTooLarge) && !errors.Is(err, kerr.RecordListTooLarge)
}

// perEvent reports whether err concerns this record only, so that the
// record belongs on the dead-letter topic and the stream may go on.
func perEvent(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.InvalidTopicException) ||
		errors.Is(err, kerr.CorruptMessage)
}

func reason(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return "too_large"
	case errors.Is(err, kerr.InvalidTopicException):
		return "invalid_topic"
	default:
		return "invalid_record"
	}
}

// headers builds the record headers; extra leaves room for more. The values
// of the transaction's headers are formatted once per transaction and shared
// by its records (the client does not modify them).
func (s *Sink) headers(e *decoder.Event, extra int) ([]kgo.RecordHeader, time.Time) {
	s.mu.Lock()
	if t := &s.last; t.lsnText == nil || t.lsn != e.CommitLSN || t.xid != e.Xid {
		*t = txnHeaders{lsn: e.CommitLSN, xid: e.Xid, lsnText: []byte(e.CommitLSN.String()),
			xidText: strconv.AppendUint(nil, uint64(e.Xid), 10), timeText: e.CommitTime.AppendFormat(nil, time.RFC3339Nano), stamp: time.Now()}
	} else if t.uses++; t.uses == stampEvery {
		t.stamp, t.uses = time.Now(), 0
	}
	t := s.last
	s.mu.Unlock()
	h := make([]kgo.RecordHeader, 0, 5+len(e.Headers)+extra)
	h = append(h,
		kgo.RecordHeader{Key: "id", Value: readOnly(e.ID)},
		kgo.RecordHeader{Key: "type", Value: readOnly(e.Type)},
		kgo.RecordHeader{Key: "walrelay.lsn", Value: t.lsnText},
		kgo.RecordHeader{Key: "walrelay.xid", Value: t.xidText},
		kgo.RecordHeader{Key: "walrelay.commit_time", Value: t.timeText},
	)
	for _, x := range e.Headers {
		h = append(h, kgo.RecordHeader{Key: x.Key, Value: x.Value})
	}
	return h, t.stamp
}

// readOnly returns the bytes of s without copying them. The client only
// reads a record's key and header values (it encodes them into a request),
// and nothing else holds the slice, so the string's immutability is kept;
// it saves three allocations per event.
func readOnly(s string) []byte {
	if s == "" {
		return []byte{} // empty, not null: Kafka tells a null key from an empty one
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// Dead-letter record headers, besides those of the event.
const (
	HeaderError     = "walrelay.error"     // the error text
	HeaderReason    = "walrelay.reason"    // invalid_event, invalid_topic, too_large, invalid_record
	HeaderSource    = "walrelay.table"     // schema.table, or "message"
	HeaderWALStart  = "walrelay.wal_start" // LSN of the change itself
	HeaderTopic     = "walrelay.topic"     // the topic it was meant for, if known
	HeaderOmitted   = "walrelay.payload_omitted_bytes"
	deadLetterTries = 2
)

// deadLetter produces e to the dead-letter topic. If that record is too large
// too, it goes again without its value, with the value's size in a header:
// the row itself is still in the table and in the WAL at its position.
func (s *Sink) deadLetter(ctx context.Context, e *decoder.Event, why, topic string, cause error, done Done) {
	s.log.Warn("dead-lettering event", "id", e.ID, "reason", why, "lsn", e.CommitLSN.String(), "source", e.Source, "err", cause)
	h, _ := s.headers(e, 6) // the dead-letter record gets the clock's time
	h = append(h,
		kgo.RecordHeader{Key: HeaderError, Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: HeaderReason, Value: []byte(why)},
		kgo.RecordHeader{Key: HeaderSource, Value: []byte(e.Source)},
		kgo.RecordHeader{Key: HeaderWALStart, Value: []byte(e.WALStart.String())},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(topic)},
	)
	r := &kgo.Record{Topic: s.cfg.DLQTopic, Partition: -1, Key: readOnly(e.AggregateID), Value: e.Payload, Headers: h}
	var produce func(try int)
	produce = func(try int) {
		s.q.push(ctx, r, false, func(r *kgo.Record, err error) {
			switch {
			case err == nil:
				done(Delivery{Topic: s.cfg.DLQTopic, Partition: r.Partition, DeadLetter: why}, nil)
			case try < deadLetterTries && errors.Is(err, kerr.MessageTooLarge) && r.Value != nil:
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderOmitted, Value: strconv.AppendInt(nil, int64(len(r.Value)), 10)})
				r.Value = nil
				go produce(try + 1)
			default:
				s.q.breakOn(err)
				done(Delivery{Topic: s.cfg.DLQTopic, Partition: r.Partition, DeadLetter: why}, fmt.Errorf("dead-letter event %s to %s (after %v): %w", e.ID, s.cfg.DLQTopic, cause, err))
			}
		})
	}
	produce(1)
}

// slogAdapter logs the client's messages through slog.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case a.l.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelDebug
	case a.l.Enabled(ctx, slog.LevelInfo):
		return kgo.LogLevelInfo
	case a.l.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	default:
		return kgo.LogLevelError
	}
}

func (a slogAdapter) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	case kgo.LogLevelInfo:
		l = slog.LevelDebug // the client's info lines are per connection: too chatty for info
	}
	a.l.Log(context.Background(), l, msg, keyvals...)
}
