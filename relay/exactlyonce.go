package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/walrelay/walrelay/replication"
	"github.com/walrelay/walrelay/sink"
)

// newTransactionalSink makes the exactly-once sink: its position records
// name the database (system identifier and name), and its transactional id
// defaults to one derived from them and the slot, stable across restarts
// and failovers to a physical standby, and distinct for every database.
func (r *Relay) newTransactionalSink(ctx context.Context) error {
	cfg := &r.cfg
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	sysID, err := replication.SystemID(sctx, &cfg.ConnConfig.Config)
	cancel()
	if err != nil {
		return fmt.Errorf("postgres.dsn: %w", err)
	}
	tc := *cfg.Sink.Transactions
	tc.Key = cfg.Slot
	tc.Source = sysID + "/" + cfg.ConnConfig.Database
	if tc.ID == "" {
		tc.ID = TransactionalID(sysID, cfg.ConnConfig.Database, cfg.Slot)
	}
	sc := cfg.Sink
	sc.Transactions = &tc
	sk, err := sink.New(sc)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	r.mu.Lock()
	r.sink, r.p.sink = sk, sk
	// The sink renews a producer refused as fenced at the next session,
	// which the source opens only if no other process streams the slot.
	_, r.p.renewsFences = r.src.(untakenOpener)
	r.mu.Unlock()
	r.log.Info("exactly-once: Kafka transactions", "transactional_id", tc.ID, "offsets_topic", tc.OffsetsTopic, "interval", tc.Interval)
	return nil
}

// TransactionalID is the default transactional id of an exactly-once relay
// of slot on the database named database of the cluster whose system
// identifier is sysID.
func TransactionalID(sysID, database, slot string) string {
	return fmt.Sprintf("walrelay-%s-%s-%s", sysID, database, slot)
}
