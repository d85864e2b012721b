package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/sink/produce"
)

// splitHooks returns opts without the options that add hooks
// (kgo.WithHooks), and the hooks those add.
//
// The sink makes several clients (the producer, one per broker, the
// dialer's probe, the exactly-once offsets reader and fencer). A hook that
// acts on a client's creation, as franz-go's kprom does (it registers its
// metrics and panics on a second registration), must see the producer
// only; the others' broker and produce events reach it through a
// produce.HookRelay.
//
// A kgo.Opt cannot be looked into: each option is tried in a client of its
// own, made and closed at once (it dials nothing), which tells whether it
// adds hooks. A hook given in opts thus sees one more client created and
// then closed (HookNewClient, then HookClientClosed: kprom registers its
// metrics and unregisters them) before the producer.
func splitHooks(opts []kgo.Opt) (rest []kgo.Opt, hooks []kgo.Hook) {
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

// clientOpts are the options of a client the sink makes besides the
// producer and the lanes: Config.Opts without their hooks, which see the
// client's broker and produce events through a relay.
func (s *Sink) clientOpts() []kgo.Opt {
	return append(s.opts[:len(s.opts):len(s.opts)], kgo.WithHooks(produce.HookRelay{Hooks: s.optHooks}))
}
