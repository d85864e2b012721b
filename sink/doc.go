// Package sink publishes outbox events to Kafka with franz-go.
//
// It sits after the decoder: each Event becomes one *kgo.Record (topic from
// the template, key the aggregate id, value the payload bytes, headers id,
// type, walrelay.lsn, walrelay.xid, walrelay.commit_time and the configured
// extra columns), produced by an idempotent producer with acks=all and
// partitioned by murmur2 of the key as the Java client does. It reports each
// event's fate to the callback given with it, and the caller (the
// checkpoint) decides what LSN that makes safe; the sink never does.
//
// An event that Kafka refuses for a reason of its own (too large, an invalid
// record or topic name) or that the decoder marked Invalid goes to the
// dead-letter topic, with the error and its source position in headers; its
// callback then reports success, and the stream goes on. Transient failures
// are retried by the client forever. Anything else (unknown topic, not
// authorized, the dead-letter topic refusing too) reaches the callback as an
// error: the pipeline must stop without confirming the event.
//
// Records go to the client in rounds behind a manual flush (rounds.go), so
// that after a failure nothing published later is sent until the caller has
// called Abort and publishes the failed event again: per-key order holds
// across failures.
package sink
