// Package recovery holds the tools that rest on the outbox table being the
// durable record of what must be published: replay a window of rows,
// reconcile a window against the topics (and the dead-letter topic), read
// the dead-letter topic back and replay it, and prune old rows without
// touching one walrelay has not confirmed. `walrelay replay`, `reconcile`,
// `dlq` and `prune` call it; it publishes through package sink, so
// routing, keys, headers, size limits and dead letters are those of `run`.
//
// A window is a time range (the configured timestamp column, or the time
// inside UUIDv7 ids), optionally one aggregate type, or a list of ids, or
// the whole table. Rows are read by one query, sorted by the server in
// the order they were committed as far as the table can tell (Order), and
// streamed, so memory does not grow with the window.
package recovery
