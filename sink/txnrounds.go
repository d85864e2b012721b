package sink

import (
	"context"

	"github.com/walrelay/walrelay/sink/produce"
)

// txnProducer is the transactional producer as txn.Rounds drives it (a
// txn.Producer): the sink's client, renewed after a fence (resume.go),
// producing in the open transaction (txn.go).
type txnProducer struct{ s *Sink }

func (p txnProducer) Produce(it produce.Item)              { p.s.produceInTxn(it) }
func (p txnProducer) Flush(ctx context.Context)            { _ = p.s.client().Flush(ctx) }
func (p txnProducer) End(ctx context.Context, commit bool) { p.s.endTxn(ctx, commit) }
