package recovery

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/longtest"
)

// produce writes n records round-robin over the partitions of topic, then
// a committed and an aborted transaction, so that partitions end with
// transaction markers and aborted records.
func produce(t *testing.T, kc *kafkatest.Cluster, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation(), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range n - 3 {
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Value: fmt.Appendf(nil, "r%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.DefaultProduceTopic(topic), kgo.TransactionalID("recovery-test"), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	for _, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort} {
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		k := 3
		if !commit {
			k = 2
		}
		for i := range k {
			tx.Produce(t.Context(), &kgo.Record{Value: fmt.Appendf(nil, "tx-%v-%d", bool(commit), i)}, nil)
		}
		if err := tx.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndTransaction(t.Context(), commit); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadTopicsWaitsForASlowBroker: with every answer of the broker 2.5 s
// late, every committed record of every partition is read (partitions end
// with transaction markers and an aborted transaction); before, the read
// stopped 2 s after it began and returned what it had, without error.
func TestReadTopicsWaitsForASlowBroker(t *testing.T) {
	longtest.Skip(t)
	t.Parallel()
	kc := kafkatest.Start(t)
	produce(t, kc, "orders", 60)
	kc.Slow(2500 * time.Millisecond)
	var got []string
	err := readTopics(t.Context(), []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...)}, []string{"orders"}, time.Time{}, func(r *kgo.Record) error {
		got = append(got, string(r.Value))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(got, ",")
	if len(got) != 60 || strings.Contains(joined, "tx-false") {
		t.Fatalf("read %d records, want the 60 committed ones: %s", len(got), joined)
	}
}

// TestReadTopicsFailsNamingWhatItDidNotRead: a partition whose end a
// transaction still open holds (read_committed reads no further) makes the
// read fail once nothing moved for the stall time, naming that partition
// and how far it was read; a partial read is never returned as whole.
func TestReadTopicsFailsNamingWhatItDidNotRead(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	produce(t, kc, "orders", 30)
	open, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.TransactionalID("recovery-open"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	open.Produce(t.Context(), &kgo.Record{Topic: "orders", Partition: 1, Value: []byte("open")}, nil)
	if err := open.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	n := 0
	err = readTopicsStall(t.Context(), 2*time.Second, []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...)}, []string{"orders"}, time.Time{}, func(r *kgo.Record) error {
		n++
		return nil
	})
	t.Logf("the read: %v", err)
	if err == nil || !strings.Contains(err.Error(), "orders partition 1 (at offset") || !strings.Contains(err.Error(), "not read to its end") {
		t.Fatalf("a read held by an open transaction after %d records: %v, want an error naming partition 1", n, err)
	}
}

// TestReadTopicsWithKprom: a library user's options with franz-go's kprom
// hook, which registers its metrics when it sees a client created (and
// panics on a second registration while the first client is open): the
// read makes its clients one after the other.
func TestReadTopicsWithKprom(t *testing.T) {
	t.Parallel()
	kc := kafkatest.Start(t)
	produce(t, kc, "orders", 10)
	m := kprom.NewMetrics("lib", kprom.Registerer(prometheus.NewRegistry()))
	n := 0
	err := readTopics(t.Context(), []kgo.Opt{kgo.SeedBrokers(kc.Addrs()...), kgo.WithHooks(m)}, []string{"orders"}, time.Time{}, func(*kgo.Record) error {
		n++
		return nil
	})
	if err != nil || n != 10 {
		t.Fatalf("read %d records, %v; want 10", n, err)
	}
}
