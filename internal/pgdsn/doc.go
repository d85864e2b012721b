// Package pgdsn shows a PostgreSQL connection string without its secrets,
// by parsing it with pgconn (the driver's own parser) and rebuilding what
// it found, never by pattern; and turns pgconn's failure to parse one into
// an error that holds no part of it. config (the start-up line, walrelay
// config, errors), relay and replication use it, so that an embedder gets
// the same guarantee.
package pgdsn
