package produce

import (
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// SplitHooks returns opts without the options that add hooks
// (kgo.WithHooks), and the hooks those add.
//
// The sink makes several clients (the producer, one per broker, the
// dialer's probe, the exactly-once offsets reader and fencer). A hook that
// acts on a client's creation, as franz-go's kprom does (it registers its
// metrics and panics on a second registration), must see the producer
// only; the others' broker and produce events reach it through a
// HookRelay.
//
// A kgo.Opt cannot be looked into: each option is tried in a client of its
// own, made and closed at once (it dials nothing), which tells whether it
// adds hooks. A hook given in opts thus sees one more client created and
// then closed (HookNewClient, then HookClientClosed: kprom registers its
// metrics and unregisters them) before the producer.
func SplitHooks(opts []kgo.Opt) (rest []kgo.Opt, hooks []kgo.Hook) {
	for _, o := range opts {
		cl, err := kgo.NewClient(o, kgo.SeedBrokers("127.0.0.1:9092"))
		if err != nil { // not valid alone: kgo.WithHooks always is
			rest = append(rest, o)
			continue
		}
		hs, _ := cl.OptValue(kgo.WithHooks).([]kgo.Hook)
		cl.Close()
		if len(hs) == 0 {
			rest = append(rest, o)
		}
		hooks = append(hooks, hs...)
	}
	return rest, hooks
}

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
