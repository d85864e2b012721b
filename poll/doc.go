// Package poll is walrelay's second source, for databases without logical
// replication (no REPLICATION privilege, wal_level below logical, no slots
// allowed on the primary): it relays the outbox by polling the table. It
// owns the dispatcher's protocol on the columns that `walrelay migrate
// --poll` adds (migrations.PollColumns): claim, lease, publish, mark.
//
//   - Claim: one short transaction selects due rows (PENDING and
//     available_at reached, or SENDING with an expired lease) in insert
//     order (created_at, then the id) with FOR UPDATE SKIP LOCKED, sets them
//     SENDING with a fresh claim id (the worker id, a random token of this
//     start and a claim number: unique even where worker ids are not),
//     lease_until and attempts + 1, and commits before anything is
//     published: no row lock is held while Kafka is written.
//   - Order per aggregate (Ordering "aggregate"): a row is not claimed while
//     an earlier row of its aggregate is unsent (SENDING under another
//     lease, PENDING in backoff, or DEAD when OnDead is "block"), unless
//     that row is claimed in the same batch, ahead of it.
//   - Parking: the rows a claim passes over because their aggregate is
//     blocked (its first unsent row in backoff, under another worker's
//     live lease, DEAD when OnDead is "block", or PARKED) are set PARKED
//     in the same statement, out of the due index, so that later claims
//     do not walk a blocked backlog again. The mark releases (PARKED to
//     PENDING, at most a batch per aggregate, ten batches in all) the rows
//     parked behind the rows it sent; once a second, before a claim, a
//     sweep releases those of each aggregate whose first unsent row is
//     PARKED (what blocked it was sent, skipped or deleted); a release
//     that fails is logged, and the claim runs all the same. A PARKED row
//     is unsent and not due, so it holds its aggregate's later rows as any
//     such row: parking and release never decide what is claimed, and a
//     race between workers can only delay a release, by up to a second.
//   - Publish through the relay's sink (same topics, keys, headers, DLQ),
//     renewing the batch's leases while Kafka has not answered.
//   - Mark: after Kafka acknowledged, a conditional update sets SENT only
//     where claim_id still matches, so a worker whose lease expired (a
//     zombie) cannot overwrite a newer claim; a row the sink dead-lettered
//     is DEAD at once; a failed row goes back to PENDING with available_at =
//     now() + 2^min(attempts, 10) s plus jitter, and after MaxAttempts to
//     the dead-letter topic and DEAD.
//   - Wake-up: LISTEN on migrations.NotifyChannel, which the insert trigger
//     notifies, with Interval as the fallback when notifications are lost.
//
// Delivery is at least once: a crash between Kafka's acknowledgement and
// the mark, or a lease that expires while Kafka is slow, sends a row again
// with the same event id.
package poll
