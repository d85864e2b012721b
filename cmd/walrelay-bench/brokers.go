package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// brokers gives one walrelay run its Kafka: the brokers' addresses, a
// topic prefix of the run's own, and what to close afterwards.
type brokers func() (addrs []string, prefix string, closeFn func(), err error)

// kfakeBrokerCount is the brokers of each kfake cluster (-kfake-brokers).
var kfakeBrokerCount = 1

// newKfake starts a kfake cluster of kfakeBrokerCount brokers.
func newKfake() (*kafkatest.Cluster, error) {
	return kafkatest.New(kfake.NumBrokers(kfakeBrokerCount))
}

// kfakeBrokers is a fresh kfake cluster per run.
func kfakeBrokers() ([]string, string, func(), error) {
	kc, err := newKfake()
	if err != nil {
		return nil, "", nil, err
	}
	return kc.Addrs(), "", kc.Close, nil
}

// realKafka is one Apache Kafka broker for the whole benchmark (-real-kafka),
// started on first use; each run writes topics under a prefix of its own.
var (
	realKafka = sync.OnceValues(func() (*kafkatest.Real, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		fmt.Fprintln(os.Stderr, "starting Apache Kafka "+kafkatest.KafkaVersion+" …")
		return kafkatest.NewReal(ctx)
	})
	realRuns atomic.Int64
)

// realCluster is one three-node Apache Kafka cluster for the whole
// benchmark (-kafka-cluster), started on first use.
var (
	realCluster = sync.OnceValues(func() (*kafkatest.RealCluster, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		fmt.Fprintln(os.Stderr, "starting a three-node Apache Kafka "+kafkatest.KafkaVersion+" cluster …")
		return kafkatest.NewRealCluster(ctx, kafkatest.FastFencing)
	})
	clusterRuns atomic.Int64
)

func clusterBrokers() ([]string, string, func(), error) {
	c, err := realCluster()
	if err != nil {
		return nil, "", nil, err
	}
	return c.Addrs(), fmt.Sprintf("bench%d.", clusterRuns.Add(1)), func() {}, nil
}

func realBrokers() ([]string, string, func(), error) {
	r, err := realKafka()
	if err != nil {
		return nil, "", nil, err
	}
	return r.Addrs(), fmt.Sprintf("bench%d.", realRuns.Add(1)), func() {}, nil
}
