// Package produce is walrelay's at-least-once producer: it hands records
// to franz-go in rounds and reports each one's answer, keeping the order
// of each key across failures.
//
// Invariants, each kept where its state lives:
//   - After a failure, nothing published later is sent until the caller
//     aborts. A record whose failure fails later ones breaks the Queue;
//     every record queued behind it is failed with ErrNotSent, unsent,
//     and no lane hands its client another, until Abort's barrier has
//     passed (Flush, PassBarrier).
//   - A key changes partition at most once: its topic's partition count
//     only ever goes up (PlacedPartitioner), and Lanes adopt a higher one
//     only once every record routed before it is answered.
//   - A partition has one batch in flight, within the topic's cap, in one
//     produce request of at most RequestCap bytes (Lanes, a lane's rounds).
//   - A broker that stops answering and that the cluster no longer lists
//     is fenced (a broker fence, not the transactional producer fence of
//     package txn): its connections closed, new ones refused (Fences,
//     Watcher), in both delivery modes (the sink dials every client,
//     the transactional one too, through Fences).
//
// The round loop (Flush) takes rounds from the Queue and hands them to a
// Sender, which it calls at the rounds' boundaries: Lanes (one client per
// broker) in at-least-once mode; in exactly-once mode package txn's
// Rounds, whose transactional producer opens, commits and aborts its
// Kafka transactions there. The loop never names transactions.
//
// Where it sits: package sink, the door, turns events into records
// (package record) and pushes them here. This package never imports
// sink; of an event it knows only the position a record carries, for the
// Sender.
package produce
