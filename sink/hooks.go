package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/sink/produce"
)

// clientOpts are the options of a client the sink makes besides the
// producer and the lanes: Config.Opts without their hooks, which see the
// client's broker and produce events through a relay.
func (s *Sink) clientOpts() []kgo.Opt {
	return append(s.opts[:len(s.opts):len(s.opts)], kgo.WithHooks(produce.HookRelay{Hooks: s.optHooks}))
}
