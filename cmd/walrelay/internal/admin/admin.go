// Package admin is walrelay's observability: the Prometheus metrics, fed by
// the relay's hooks, the Kafka client's connection hook and a poll of the
// slot, and the admin HTTP listener (/healthz, /readyz, /metrics, /status,
// and /debug/pprof when asked). It reads the relay; the relay does not know
// it.
package admin

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

// States of the replication stream or the poller, as the state metric
// labels them.
var streamStates = []string{"starting", "streaming", "waiting_for_slot", "reconnecting", "polling", "stopped"}

// Source is what the metrics and the listener read of the running
// pipeline: *relay.Relay (source wal) or *poll.Poller (source poll).
type Source interface {
	State() string
	InFlight() int
	Reconnects() uint64
	DataLosses() uint64
	Err() error
}

// positions are a relay's WAL positions.
type positions interface {
	ReceivedLSN() pglogrepl.LSN
	ConfirmedLSN() pglogrepl.LSN
}

var (
	_ positions = (*relay.Relay)(nil)
	_ Source    = (*relay.Relay)(nil)
	_ Source    = (*poll.Poller)(nil)
)

// ready reports whether a state is one of a working pipeline.
func ready(state string) bool { return state == "streaming" || state == "polling" }

// Metrics are walrelay's Prometheus metrics, prefix walrelay_, on a registry
// of their own, with the Go runtime's and the process's.
type Metrics struct {
	reg           *prometheus.Registry
	published     *prometheus.CounterVec
	publishedBy   sync.Map     // table -> *sync.Map of topic -> prometheus.Counter of published
	topicSeries   atomic.Int64 // series of published, at most maxTopicSeries and one (other) per table
	deadLettered  *prometheus.CounterVec
	publishErrors *prometheus.CounterVec
	orderBreaks   prometheus.Counter
	transactions  prometheus.Counter
	ignored       *prometheus.CounterVec
	slotLag       prometheus.Gauge
	slotRetained  prometheus.Gauge
	slotSafe      *prometheus.GaugeVec // no labels: absent until set
	commitToAck   prometheus.Histogram
	kafkaTxns     *prometheus.CounterVec
	kafkaTxnTime  prometheus.Histogram
	committedAt   atomic.Uint64 // exactly-once: the committed position's commit LSN
	committedPos  atomic.Value  // string: the committed position
	txnCommitted  atomic.Int64
	txnAborted    atomic.Int64

	kafka           *kprom.Metrics // the Kafka client's own metrics (walrelay_kafka_*)
	kafkaReconnects atomic.Uint64
	kafkaOK         atomic.Int64 // unix nanoseconds of the last broker success
	kafkaFail       atomic.Int64 // unix nanoseconds of the last broker connect failure
	kafkaDownAt     atomic.Int64 // unix nanoseconds of the first connect failure after a success
	outageFails     atomic.Int64 // connect failures since the first one after a success
	kafkaErr        atomic.Value // string: the last connect failure

	registry *registryState // the schema registry's answers (RegistryRequest)

	publishedN, deadLetteredN atomic.Int64
	newestAcked               atomic.Int64 // unix nanoseconds of the newest acknowledged commit

	mu      sync.Mutex
	perSec  [60]int64 // events acknowledged per second, a ring
	secOf   [60]int64 // the unix second each slot counts
	lag     *int64
	retain  *int64
	slotErr string

	pollStats  []poll.Stats // the last read of the outbox tables (source poll)
	pollRows   *prometheus.GaugeVec
	pollAge    *prometheus.GaugeVec
	pollClaim  *prometheus.HistogramVec
	pollMark   *prometheus.HistogramVec
	pollRowsN  *prometheus.CounterVec
	pollRelErr *prometheus.CounterVec
}

// New returns the metrics, registered.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.registry = newRegistryState(m.reg)
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }
	m.published = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_events_published_total", Help: "Events acknowledged by Kafka on their topic, by outbox table (schema.table; message for walrelay_emit); past 1000 topics, the others' events under topic=\"(other)\"."}, []string{"table", "topic"})
	m.deadLettered = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_events_dead_lettered_total", Help: "Events acknowledged on the dead-letter topic, by outbox table and reason."}, []string{"table", "reason"})
	m.publishErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_publish_errors_total", Help: "Errors publishing to Kafka, by kind (connect: a broker connection failed and is retried; fatal: the pipeline stopped)."}, []string{"kind"})
	m.transactions = prometheus.NewCounter(prometheus.CounterOpts{Name: "walrelay_transactions_total", Help: "Transactions received from the slot."})
	m.ignored = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_changes_ignored_total", Help: "Changes that are not outbox events, by kind."}, []string{"kind"})
	m.slotLag = prometheus.NewGauge(prometheus.GaugeOpts{Name: "walrelay_slot_lag_bytes", Help: "The server's WAL position minus the slot's confirmed_flush_lsn."})
	m.slotRetained = prometheus.NewGauge(prometheus.GaugeOpts{Name: "walrelay_slot_retained_wal_bytes", Help: "The server's WAL position minus the slot's restart_lsn: WAL the slot keeps on disk."})
	m.slotSafe = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walrelay_slot_safe_wal_bytes", Help: "WAL that can still be written before max_slot_wal_keep_size invalidates the slot (safe_wal_size); absent while it is unlimited."}, nil)
	m.commitToAck = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "walrelay_commit_to_ack_seconds", Help: "From an event's commit in PostgreSQL to Kafka's acknowledgement.",
		Buckets: []float64{.001, .0025, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}})
	m.orderBreaks = prometheus.NewCounter(prometheus.CounterOpts{Name: "walrelay_order_breaks_total", Help: "Events written ahead of an earlier event of their partition that failed to publish and was sent again after them (must stay 0; see Reconnects in docs/operations.md)."})
	m.kafkaTxns = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_kafka_transactions_total", Help: "Kafka transactions of exactly-once mode, by outcome (committed, aborted)."}, []string{"outcome"})
	m.kafkaTxnTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "walrelay_kafka_transaction_commit_seconds", Help: "How long a Kafka transaction's commit (EndTxn) took, in exactly-once mode.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}})
	committedLSN := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "walrelay_kafka_committed_lsn", Help: "Exactly-once mode: the commit LSN of the last event in a committed Kafka transaction, as a number."},
		func() float64 { return float64(m.committedAt.Load()) })
	// By broker, not by topic: a row chooses its topic, and the topics'
	// series would grow with every new one (walrelay_events_published_total
	// counts by topic, bounded).
	m.kafka = kprom.NewMetrics("walrelay_kafka", kprom.Registerer(m.reg), kprom.Gatherer(m.reg), kprom.FetchAndProduceDetail(kprom.ByNode, kprom.UncompressedBytes))
	for _, c := range []prometheus.Collector{m.published, m.deadLettered, m.publishErrors, m.orderBreaks, m.transactions, m.ignored, m.slotLag, m.slotRetained, m.slotSafe, m.commitToAck,
		m.kafkaTxns, m.kafkaTxnTime, committedLSN,
		// The Go runtime's and the process's own (go_*, process_*: heap, GC,
		// goroutines, RSS, CPU, open files).
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		f(c)
	}
	return m
}

// Hooks are the relay's hooks that count.
func (m *Metrics) Hooks() relay.Hooks {
	return relay.Hooks{
		Transaction:  m.transactions.Inc,
		Acked:        m.acked,
		PublishError: func(kind string) { m.publishErrors.WithLabelValues(kind).Inc() },
		OrderBreak:   m.orderBreaks.Inc,
		Ignored: func(kind string) {
			if kind != "relation" && kind != "type" && kind != "origin" {
				m.ignored.WithLabelValues(kind).Inc()
			}
		},
	}
}

// TransactionHooks observe exactly-once mode's Kafka transactions
// (sink.Transactions' OnCommit and OnAbort).
func (m *Metrics) TransactionHooks() (onCommit func(event.Position, time.Duration), onAbort func()) {
	return func(last event.Position, took time.Duration) {
			m.kafkaTxns.WithLabelValues("committed").Inc()
			m.kafkaTxnTime.Observe(took.Seconds())
			m.committedAt.Store(uint64(last.CommitLSN))
			m.committedPos.Store(last.String())
			m.txnCommitted.Add(1)
		}, func() {
			m.kafkaTxns.WithLabelValues("aborted").Inc()
			m.txnAborted.Add(1)
		}
}

// RegisterTracing adds walrelay_trace_spans_dropped_total, read from
// dropped at scrape time (tracing.enabled).
func (m *Metrics) RegisterTracing(dropped func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "walrelay_trace_spans_dropped_total",
		Help: "Trace spans dropped because the queue to the OTLP exporter was full or the export failed (tracing.enabled); events never wait for spans."},
		func() float64 { return float64(dropped()) }))
}

// Register adds the gauges read from the running pipeline at scrape time.
func (m *Metrics) Register(r Source) {
	gauge := func(name, help string, fn func() float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
	}
	gauge("walrelay_in_flight_events", "Events handed to Kafka and not yet acknowledged.", func() float64 { return float64(r.InFlight()) })
	if w, ok := r.(positions); ok {
		gauge("walrelay_received_lsn", "Highest WAL position received from the server.", func() float64 { return float64(w.ReceivedLSN()) })
		gauge("walrelay_confirmed_lsn", "WAL position confirmed to the slot (every event before it is acknowledged).", func() float64 { return float64(w.ConfirmedLSN()) })
	}
	gauge("walrelay_seconds_behind_source", "Now minus the commit time of the newest acknowledged transaction; 0 when idle.", func() float64 { return m.behind(r) })
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "walrelay_producer_data_loss_total",
		Help: "Times the producer detected that the broker may have lost records it had acknowledged (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID); each restarts the stream from the confirmed position."},
		func() float64 { return float64(r.DataLosses()) }))
	m.reg.MustRegister(&reconnectCollector{
		desc:  prometheus.NewDesc("walrelay_reconnects_total", "Reconnections, by target: the replication stream started again, or the poller connected again (postgres), a broker connection failed and is retried (kafka).", []string{"target"}, nil),
		pg:    r.Reconnects,
		kafka: &m.kafkaReconnects,
	})
	for _, s := range streamStates {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "walrelay_state", Help: "1 for the replication stream's (or the poller's) current state.", ConstLabels: prometheus.Labels{"state": s}},
			func() float64 {
				if r.State() == s {
					return 1
				}
				return 0
			}))
	}
}

func (m *Metrics) behind(r Source) float64 {
	if r.InFlight() == 0 {
		return 0
	}
	n := m.newestAcked.Load()
	if n == 0 {
		return 0
	}
	return time.Since(time.Unix(0, n)).Seconds()
}

// maxTopicSeries bounds the series of walrelay_events_published_total
// with a topic of their own, over all tables: a row chooses its topic, so
// rows with ever new aggregate types would otherwise add series (and
// memory, here and in Prometheus) without end. The events of the topics
// past it count under OtherTopic, one series per table.
const maxTopicSeries = 1000

// OtherTopic is the topic label of the events of the topics past
// maxTopicSeries. Parentheses are not legal in a topic name, so it is no
// topic's.
const OtherTopic = "(other)"

// publishedOn returns the published counter of a table's events on a
// topic, remembered: a label lookup per event costs more than the rest of
// acked.
func (m *Metrics) publishedOn(table, topic string) prometheus.Counter {
	byTopic, ok := m.publishedBy.Load(table)
	if !ok {
		byTopic, _ = m.publishedBy.LoadOrStore(table, &sync.Map{})
	}
	topics := byTopic.(*sync.Map)
	if c, ok := topics.Load(topic); ok {
		return c.(prometheus.Counter)
	}
	if m.topicSeries.Add(1) > maxTopicSeries {
		m.topicSeries.Add(-1)
		if c, ok := topics.Load(OtherTopic); ok {
			return c.(prometheus.Counter)
		}
		c, _ := topics.LoadOrStore(OtherTopic, m.published.WithLabelValues(table, OtherTopic))
		return c.(prometheus.Counter)
	}
	c, loaded := topics.LoadOrStore(topic, m.published.WithLabelValues(table, topic))
	if loaded {
		m.topicSeries.Add(-1) // another goroutine made it first
	}
	return c.(prometheus.Counter)
}

// acked records one acknowledged event.
func (m *Metrics) acked(table, topic, deadLetter string, commit time.Time) {
	if deadLetter != "" {
		m.deadLettered.WithLabelValues(table, deadLetter).Inc()
		m.deadLetteredN.Add(1)
	} else {
		m.publishedOn(table, topic).Inc()
		m.publishedN.Add(1)
	}
	now := time.Now()
	m.kafkaOK.Store(now.UnixNano())
	if !commit.IsZero() {
		m.commitToAck.Observe(now.Sub(commit).Seconds())
		for n := commit.UnixNano(); ; {
			old := m.newestAcked.Load()
			if n <= old || m.newestAcked.CompareAndSwap(old, n) {
				break
			}
		}
	}
	sec := now.Unix()
	m.mu.Lock()
	i := sec % 60
	if m.secOf[i] != sec {
		m.secOf[i], m.perSec[i] = sec, 0
	}
	m.perSec[i]++
	m.mu.Unlock()
}

// rate returns the events acknowledged per second over the last minute.
func (m *Metrics) rate() float64 {
	now := time.Now().Unix()
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for i := range m.perSec {
		if now-m.secOf[i] < 60 {
			n += m.perSec[i]
		}
	}
	return float64(n) / 60
}

// PollSlot reads the slot's lag and retained WAL every interval until ctx
// ends, on a connection of its own.
func (m *Metrics) PollSlot(ctx context.Context, connCfg *pgx.ConnConfig, slot string, every time.Duration, log *slog.Logger) {
	relay.Periodically(ctx, connCfg, every, func(ctx context.Context, conn *pgx.Conn) error {
		st, err := replication.Slots(ctx, conn, slot)
		if err != nil {
			return err
		}
		m.mu.Lock()
		m.lag, m.retain, m.slotErr = st[0].LagBytes, st[0].RetainedWALBytes, ""
		m.mu.Unlock()
		if st[0].LagBytes != nil {
			m.slotLag.Set(float64(*st[0].LagBytes))
		}
		if st[0].RetainedWALBytes != nil {
			m.slotRetained.Set(float64(*st[0].RetainedWALBytes))
		}
		if st[0].SafeWALSize != nil {
			m.slotSafe.WithLabelValues().Set(float64(*st[0].SafeWALSize))
		} else {
			m.slotSafe.Reset()
		}
		return nil
	}, func(err error) {
		m.mu.Lock()
		m.slotErr = err.Error()
		m.mu.Unlock()
		log.Debug("read slot status", "err", err)
	})
}

// reconnectCollector reads the reconnect counts where they are kept.
type reconnectCollector struct {
	desc  *prometheus.Desc
	pg    func() uint64
	kafka *atomic.Uint64
}

func (c *reconnectCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *reconnectCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.pg()), "postgres")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.kafka.Load()), "kafka")
}

// KafkaHooks are the Kafka client's hooks (kgo.WithHooks): the client's own
// metrics (franz-go's kprom: requests, bytes, connections, by broker, as
// walrelay_kafka_*), and a count of broker connection failures and
// successes for walrelay's metrics and the readiness check.
func (m *Metrics) KafkaHooks() []kgo.Hook { return []kgo.Hook{kafkaHook{m}, m.kafka} }

type kafkaHook struct{ m *Metrics }

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h kafkaHook) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	now := time.Now().UnixNano()
	if err != nil {
		if !h.m.kafkaReachable() {
			h.m.kafkaDownAt.CompareAndSwap(0, now)
			h.m.outageFails.Add(1)
		} else {
			h.m.kafkaDownAt.Store(now)
			h.m.outageFails.Store(1)
		}
		h.m.kafkaErr.Store(err.Error())
		h.m.kafkaFail.Store(now)
		h.m.kafkaReconnects.Add(1)
		h.m.publishErrors.WithLabelValues("connect").Inc()
		return
	}
	h.m.kafkaOK.Store(now)
}

// OnBrokerRead implements kgo.HookBrokerRead: any answer of a broker shows
// that Kafka answers, also while exactly-once mode holds the
// acknowledgements of its open transaction.
func (h kafkaHook) OnBrokerRead(_ kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err == nil {
		h.m.kafkaOK.Store(time.Now().UnixNano())
	}
}

// kafkaReachable reports whether the last word from the brokers was good.
func (m *Metrics) kafkaReachable() bool { return m.kafkaOK.Load() >= m.kafkaFail.Load() }
