package config

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

// SoftMemoryLimit is the soft memory limit memory_limit gives: as set, or
// kafka.max_buffered_bytes + 16 MiB (32 MiB with the default buffers).
//
// The buffers hold most of what walrelay keeps: the records published and
// not yet acknowledged (in exactly-once mode the open Kafka transaction's
// too), each sharing its payload with its event; the 16 MiB is the rest of
// the live heap (the message being decoded, up to
// postgres.max_message_bytes, the produce request being encoded, one batch
// of kafka.batch_max_bytes: sink's requestCap) and the collector's room
// above it. The limit bounds the Go runtime's memory only: the binary's
// code and read-only data, about 27 MiB resident from the start, come on
// top, so 32 MiB keeps a walrelay with the default settings under its 64
// MiB budget, which 2 × the buffers + 16 MiB (48 MiB) did not: catch-ups
// peaked at 66 to 68 MiB with it at 300-byte to 512 KiB payloads, 76 MiB
// with 64 KiB payloads that compression does not shrink
// (docs/benchmarks.md).
func (c *Config) SoftMemoryLimit() int64 {
	if c.MemoryLimit > 0 {
		return int64(c.MemoryLimit)
	}
	return int64(c.Kafka.MaxBufferedBytes) + 16<<20
}

// MaxMessageBytes is the largest event held in memory that
// postgres.max_message_bytes gives: as set, or 2 × kafka.batch_max_bytes +
// 1 MiB. A record larger than the batch cap is dead-lettered in any case,
// and a bytea payload arrives as hex, twice the size of its record.
func (c *Config) MaxMessageBytes() int64 {
	if c.Postgres.MaxMessageBytes > 0 {
		return int64(c.Postgres.MaxMessageBytes)
	}
	return 2*int64(c.Kafka.BatchMaxBytes) + 1<<20
}

// OutboxConfig is the outbox tables, their columns, and the message
// prefixes.
func (c *Config) OutboxConfig() decoder.Config {
	o := c.Outbox
	base := decoder.Layout{
		Columns: decoder.Columns{
			ID: o.IDColumn, AggregateType: o.AggregateTypeColumn, AggregateID: o.AggregateIDColumn, Type: o.TypeColumn, Payload: o.PayloadColumn,
		},
		PartitionColumn: o.PartitionColumn, TimestampColumn: o.TimestampColumn, OrderColumn: o.OrderColumn, TraceColumn: o.TraceColumn,
		VersionColumn: o.VersionColumn,
	}
	base.HeaderColumns, base.HeaderNames = headerColumns(o.HeaderColumns)
	cfg := decoder.Config{Messages: o.Messages, MessagePrefix: o.MessagePrefix, IgnoredPrefixes: o.IgnorePrefixes}
	if len(o.Tables) == 0 {
		cfg.Layout = base
		cfg.Schema, cfg.Table, _ = c.Table()
		return cfg.WithDefaults()
	}
	for i, t := range o.Tables {
		if i == 0 {
			cfg.Layout = t.layout(base)
		} else {
			cfg.More = append(cfg.More, t.layout(base).WithDefaults())
		}
	}
	return cfg.WithDefaults()
}

// Layout returns the outbox table named name (schema.table; a bare name is
// in public), or with name empty the only one: for a command that works on
// one table. Several tables and no name is an error that lists them.
func (c *Config) Layout(name string) (decoder.Layout, error) {
	ls := c.OutboxConfig().Layouts()
	var names []string
	for _, l := range ls {
		names = append(names, l.Name())
	}
	if name == "" {
		if len(ls) == 1 {
			return ls[0], nil
		}
		return decoder.Layout{}, fmt.Errorf("there are several outbox tables (%s): name one with --table", strings.Join(names, ", "))
	}
	schema, table, _ := splitTable(name)
	for _, l := range ls {
		if l.Schema == schema && l.Table == table {
			return l, nil
		}
	}
	return decoder.Layout{}, fmt.Errorf("--table %s is not an outbox table of the configuration (%s)", name, strings.Join(names, ", "))
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
		ConnString: p.DSN, Slot: p.Slot, Publication: p.Publication, CreateSlot: p.CreateSlot, SlotFailover: p.SlotFailover, AllowRowFilter: p.AllowRowFilter,
		StatusInterval: p.StatusInterval, ReceiveTimeout: p.ReceiveTimeout, MaxMessageBytes: c.MaxMessageBytes(),
		Outbox: c.OutboxConfig(), Sink: scfg, HeartbeatInterval: c.Heartbeat.Interval, ShutdownTimeout: c.ShutdownTimeout, Logger: log,
		RefusalStopAfter: c.Kafka.RefusalStopAfter,
	}, nil
}

// Table splits postgres.table into schema and name; a bare name is in public.
func (c *Config) Table() (schema, name string, err error) {
	schema, name, ok := splitTable(c.Postgres.Table)
	if !ok {
		return "", "", fmt.Errorf("postgres.table %q: want schema.table", c.Postgres.Table)
	}
	return schema, name, nil
}

// PollConfig maps the configuration onto the poll source's (source poll);
// extra options go to the Kafka client last.
func (c *Config) PollConfig(log *slog.Logger, extra ...kgo.Opt) (poll.Config, error) {
	scfg, err := SinkConfig(c, log, extra...)
	if err != nil {
		return poll.Config{}, err
	}
	connCfg, err := pgx.ParseConfig(c.Postgres.DSN)
	if err != nil {
		return poll.Config{}, fmt.Errorf("postgres.dsn: %w", err)
	}
	p := c.Poll
	return poll.Config{
		ConnConfig: connCfg, Outbox: c.OutboxConfig(), Interval: p.Interval, BatchSize: p.BatchSize, Lease: p.Lease, MaxAttempts: p.MaxAttempts, MaxEventBytes: c.MaxMessageBytes(),
		Ordering: p.Ordering, OnDead: p.OnDead, WorkerID: p.WorkerID, ShutdownTimeout: c.ShutdownTimeout, Sink: scfg, Logger: log,
	}, nil
}

// headerColumns splits the entries of a header_columns list, each a
// column or column:header (the header's name when it is not the
// column's, as Debezium's placement column:header:name gives it), into
// the columns and the names that differ.
func headerColumns(entries []string) ([]string, map[string]string) {
	if entries == nil {
		return nil, nil
	}
	cols := make([]string, 0, len(entries))
	var names map[string]string
	for _, e := range entries {
		col, name, ok := strings.Cut(e, ":")
		cols = append(cols, col)
		if ok && name != col {
			if names == nil {
				names = map[string]string{}
			}
			names[col] = name
		}
	}
	return cols, names
}
