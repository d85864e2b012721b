// Package sink publishes outbox events to Kafka with franz-go.
//
// It sits after the decoder: each event.Event becomes one *kgo.Record (topic,
// key, value and headers, all package record's), produced by an idempotent producer with acks=all and
// partitioned by murmur2 of the key as the Java client does. What an event
// becomes (route and allowed topics, key, headers, the JSON formats and
// expansion) is package record's, a pure function of the event and the
// configuration; the sink adds what needs Kafka or a schema registry (a
// topic's limits and partition count, the registry formats, the clock's
// timestamp) and everything after: rounds, lanes, broker fences, transactions,
// the dead-letter topic. Package sink is the one door: the relay, the poll
// source, the inbox's dead letters and the recovery tools call it, never
// package record's Builder. It reports each
// event's fate to the callback given with it, and the caller (the
// checkpoint) decides what LSN that makes safe; the sink never does.
//
// An event that Kafka refuses for a reason of its own (too large, an invalid
// record or topic name) or that the decoder marked Invalid goes to the
// dead-letter topic, with the error and its source position in headers; its
// callback then reports success, and the stream goes on. A refusal that may
// be of the batch rather than the record (a batch too large for a limit
// lowered meanwhile; INVALID_RECORD, CORRUPT_MESSAGE or INVALID_TOPIC for a
// batch, which the client fails with every record of the partition behind
// it) is transient: the caller restarts, and the record goes again (alone,
// for the latter, so that only a record refused alone is dead-lettered).
// Data loss detected by the client (OUT_OF_ORDER_SEQUENCE_NUMBER,
// UNKNOWN_PRODUCER_ID) fails what is queued with ErrDataLoss, so that the
// caller restarts from its confirmed position. Transient failures
// are retried by the client forever. Anything else (unknown topic, not
// authorized, the dead-letter topic refusing too) reaches the callback as an
// error, which the event must not be confirmed past. Every error handed to a
// Done is marked with its kind (package failure): fatal when retrying cannot
// fix it (authorization), else retriable (a topic that does not exist
// too: the relay stops on it once refused over a span of time); a
// per-event error never reaches a Done (the event is dead-lettered).
//
// Behind the door, one package per guarantee, none importing sink: package
// record (what an event becomes; pure); package produce, the at-least-once
// producer (rounds behind a manual flush, one client and rounds per
// broker, fences, the batch and request sizes: after a failure nothing
// published later is sent until the caller has called Abort and publishes
// the failed event again, so per-key order holds across failures; a key
// changes partition at most once); and package txn, the exactly-once
// producer (the transactional client and its transactions, the position on
// the offsets topic, Resume and the renewals after fences, its rounds and
// the poison records: records and their source position commit together; a
// fenced producer never commits). What stays here is the door's: what each
// refusal means to the pipeline, the registry formats, a topic's limits
// and partition count read from Kafka, the dead-letter topic.
//
// The round loop (produce.Flush) calls a produce.Sender at the rounds'
// boundaries: the lanes in at-least-once mode, so that a slow broker holds
// back only the partitions it leads; in exactly-once mode txn.Rounds,
// which has the transactional producer commit or abort its transactions
// there. A leader that stops answering without closing its connections is
// given up as soon as the cluster has fenced it (produce.Fences), not
// after a request timeout.
package sink
