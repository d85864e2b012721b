package produce

import (
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// HookRelay passes a lane client's producer and broker events on to the
// hooks given for the producer, but not its creation (HookNewClient).
type HookRelay struct{ Hooks []kgo.Hook }

func (h HookRelay) OnBrokerConnect(m kgo.BrokerMetadata, d time.Duration, c net.Conn, err error) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookBrokerConnect); ok {
			y.OnBrokerConnect(m, d, c, err)
		}
	}
}

func (h HookRelay) OnBrokerDisconnect(m kgo.BrokerMetadata, c net.Conn) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookBrokerDisconnect); ok {
			y.OnBrokerDisconnect(m, c)
		}
	}
}

func (h HookRelay) OnBrokerWrite(m kgo.BrokerMetadata, key int16, n int, wait, took time.Duration, err error) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookBrokerWrite); ok {
			y.OnBrokerWrite(m, key, n, wait, took, err)
		}
	}
}

func (h HookRelay) OnBrokerRead(m kgo.BrokerMetadata, key int16, n int, wait, took time.Duration, err error) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookBrokerRead); ok {
			y.OnBrokerRead(m, key, n, wait, took, err)
		}
	}
}

func (h HookRelay) OnBrokerE2E(m kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookBrokerE2E); ok {
			y.OnBrokerE2E(m, key, e2e)
		}
	}
}

func (h HookRelay) OnBrokerThrottle(m kgo.BrokerMetadata, d time.Duration, after bool) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookBrokerThrottle); ok {
			y.OnBrokerThrottle(m, d, after)
		}
	}
}

func (h HookRelay) OnProduceBatchWritten(m kgo.BrokerMetadata, topic string, partition int32, pm kgo.ProduceBatchMetrics) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookProduceBatchWritten); ok {
			y.OnProduceBatchWritten(m, topic, partition, pm)
		}
	}
}

func (h HookRelay) OnProduceRecordBuffered(r *kgo.Record) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookProduceRecordBuffered); ok {
			y.OnProduceRecordBuffered(r)
		}
	}
}

func (h HookRelay) OnProduceRecordPartitioned(r *kgo.Record, broker int32) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookProduceRecordPartitioned); ok {
			y.OnProduceRecordPartitioned(r, broker)
		}
	}
}

func (h HookRelay) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	for _, x := range h.Hooks {
		if y, ok := x.(kgo.HookProduceRecordUnbuffered); ok {
			y.OnProduceRecordUnbuffered(r, err)
		}
	}
}
