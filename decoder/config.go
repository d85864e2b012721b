package decoder

import (
	"fmt"
)

// Config configures a Decoder. Zero values mean the defaults.
type Config struct {
	// Layout is the outbox table (the first, when there are several).
	Layout
	// More are further outbox tables read from the same stream, each with
	// its own layout; their Table must be set.
	More []Layout
	// Messages turns the logical decoding messages under MessagePrefix into
	// events (the outbox without a table, walrelay_emit). Default false:
	// they are ignored (Ignored kind "message_source_off"), because
	// PostgreSQL lets every role call pg_logical_emit_message unless its
	// EXECUTE is revoked from PUBLIC; whoever turns it on must see that
	// only the outbox's writers may (relay.CheckMessagePrivileges).
	Messages bool
	// MessagePrefix is the logical decoding message prefix whose messages
	// become events (with Messages). Default "walrelay". Messages with the
	// prefix MessagePrefix+".heartbeat" are ignored as heartbeats.
	MessagePrefix string
	// IgnoredPrefixes are prefixes of other programs' logical decoding
	// messages, expected: ignored as kind "message_ignored_prefix". A
	// message under any other prefix is ignored too, as kind
	// "message_foreign_prefix", which the relay logs once per prefix.
	IgnoredPrefixes []string
	// MessagesFrom is, with Messages, the full transaction id (xid8) from
	// which messages under MessagePrefix are trusted: every transaction
	// that began before only the outbox's writers could execute
	// pg_logical_emit_message has an older one (walrelay migrate records
	// it: migrations.MessageHorizon). A message from an older transaction
	// is an event whose Invalid wraps event.ErrBeforePrivileges, which the
	// sink dead-letters. Zero trusts every transaction.
	MessagesFrom uint64
	// XidNow is a recent full transaction id of the server (the relay
	// reads it at start), from which the 32-bit xids of the stream are
	// widened to compare them with MessagesFrom across xid wraparound.
	// Zero means MessagesFrom.
	XidNow uint64
}

// Layouts returns every outbox table of cfg, the first first, defaults
// filled in.
func (cfg Config) Layouts() []Layout {
	ls := make([]Layout, 0, 1+len(cfg.More))
	for _, l := range append([]Layout{cfg.Layout}, cfg.More...) {
		ls = append(ls, l.WithDefaults())
	}
	return ls
}

// WithDefaults returns cfg with its empty fields set to the defaults.
func (cfg Config) WithDefaults() Config {
	cfg.Layout = cfg.Layout.WithDefaults()
	if cfg.MessagePrefix == "" {
		cfg.MessagePrefix = "walrelay"
	}
	return cfg
}

// Validate checks cfg's tables and header columns, as New does; the
// configuration calls it whatever the source, so that the poll source
// refuses what the relay would.
func (cfg Config) Validate() error {
	cfg = cfg.WithDefaults()
	tables := map[string]bool{}
	for i, l := range cfg.More {
		if l.Table == "" {
			return fmt.Errorf("outbox table %d: no table name", i+2)
		}
	}
	for _, l := range cfg.Layouts() {
		if err := l.CheckNames(); err != nil {
			return err
		}
		if tables[l.Name()] {
			return fmt.Errorf("outbox table %s: listed twice", l.Name())
		}
		tables[l.Name()] = true
		seen, named := map[string]bool{}, map[string]string{}
		for _, h := range l.HeaderColumns {
			if h == "" || seen[h] {
				return fmt.Errorf("header column %q of %s: empty or listed twice", h, l.Name())
			}
			seen[h] = true
			name := l.HeaderName(h)
			if other, ok := named[name]; ok || name == "" {
				return fmt.Errorf("header column %q of %s: its header %q is empty or also that of column %q", h, l.Name(), name, other)
			}
			if why := reservedHeader(l, name); why != "" {
				return fmt.Errorf("header column %q of %s: its header %q is reserved (%s): name it otherwise (column:name)", h, l.Name(), name, why)
			}
			named[name] = h
		}
		for c := range l.HeaderNames {
			if !seen[c] {
				return fmt.Errorf("header name of column %q of %s: not a header column", c, l.Name())
			}
		}
	}
	return nil
}
