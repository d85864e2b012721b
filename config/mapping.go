package config

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

// SoftMemoryLimit is the soft memory limit memory_limit gives: as set, or
// derived from the buffers, which hold most of what walrelay keeps.
func (c *Config) SoftMemoryLimit() int64 {
	if c.MemoryLimit > 0 {
		return int64(c.MemoryLimit)
	}
	return 2*int64(c.Kafka.MaxBufferedBytes) + 16<<20
}

// OutboxConfig is the outbox table, its columns and message prefixes.
func (c *Config) OutboxConfig() decoder.Config {
	schema, table, _ := c.Table()
	o := c.Outbox
	return decoder.Config{
		Schema: schema, Table: table,
		Columns: decoder.Columns{
			ID: o.IDColumn, AggregateType: o.AggregateTypeColumn, AggregateID: o.AggregateIDColumn, Type: o.TypeColumn, Payload: o.PayloadColumn,
		},
		HeaderColumns: o.HeaderColumns, PartitionColumn: o.PartitionColumn, TimestampColumn: o.TimestampColumn, TraceColumn: o.TraceColumn,
		MessagePrefix: o.MessagePrefix, IgnoredPrefixes: o.IgnorePrefixes,
	}.WithDefaults()
}

// PublicationSpec is what the publication pub must publish.
func (c *Config) PublicationSpec(pub string) replication.Outbox {
	return relay.PublicationSpec(c.OutboxConfig(), pub, c.Postgres.AllowRowFilter)
}

// RelayConfig maps the configuration onto the relay's; extra options go to
// the Kafka client last.
func (c *Config) RelayConfig(log *slog.Logger, extra ...kgo.Opt) (relay.Config, error) {
	scfg, err := SinkConfig(c, log, extra...)
	if err != nil {
		return relay.Config{}, err
	}
	p := c.Postgres
	return relay.Config{
		ConnString: p.DSN, Slot: p.Slot, Publication: p.Publication, CreateSlot: p.CreateSlot, AllowRowFilter: p.AllowRowFilter,
		StatusInterval: p.StatusInterval, ReceiveTimeout: p.ReceiveTimeout,
		Outbox: c.OutboxConfig(), Sink: scfg, HeartbeatInterval: c.Heartbeat.Interval, ShutdownTimeout: c.ShutdownTimeout, Logger: log,
	}, nil
}

// Table splits postgres.table into schema and name; a bare name is in public.
func (c *Config) Table() (schema, name string, err error) {
	parts := strings.Split(c.Postgres.Table, ".")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return "public", parts[0], nil
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("postgres.table %q: want schema.table", c.Postgres.Table)
}
