// Package produce is walrelay's at-least-once producer: it hands records
// to franz-go in rounds and reports each one's answer, keeping the order
// of each key across failures.
//
// Invariants:
//   - After a failure, nothing published later is sent until the caller
//     aborts: a record whose failure fails later ones breaks the queue,
//     and every record queued behind it is failed with ErrNotSent,
//     unsent, until Abort's barrier has passed (Queue).
//   - A key changes partition at most once: a topic's records are
//     partitioned by a count of partitions that only ever goes up
//     (PlacedPartitioner), and a higher count is adopted only at an
//     Abort barrier.
//   - A record batch never exceeds the topic's cap, nor a produce request
//     RequestCap: a partition's batch is one request's.
//
// Where it sits: package sink, the door, turns events into records
// (package record) and pushes them here; it never imports sink, and
// knows nothing of events, dead letters or transactions: what
// exactly-once mode needs of a round it asks through its hooks.
package produce
