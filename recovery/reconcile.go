package recovery

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink"
)

// Reconciler compares a window of the outbox table with what the topics
// and the dead-letter topic hold.
type Reconciler struct {
	Table     *Table
	Publisher Publisher // routes rows to their topics; publishes --replay
	Kafka     []kgo.Opt // the brokers and their security
	DLQTopic  string
	Slot      string
	// IgnoreSlots are logical slots of the database that do not read the
	// outbox table: not waited for. Every other one is (waitForSlots).
	IgnoreSlots []string
	// Wait bounds how long to wait for the slot to confirm past the
	// reconcile's start. Default 30s.
	Wait time.Duration
	// Margin reads the topics from this long before the window's start:
	// a record is produced after its row's time, on a clock that may be
	// behind the database's. Default 5m.
	Margin time.Duration
	// Replay republishes the missing rows (as Replay does); with Poll, it
	// sets them back to PENDING for the poller instead.
	Replay bool
	// Poll is for an outbox of the poll source: only the rows its poller
	// considers sent (SENT, DEAD) are judged; the others (PENDING,
	// SENDING, PARKED) are in flight (Reconciled.InFlight) and never sent
	// by the reconcile, which would send them ahead of an earlier unsent
	// row of their aggregate. A judged row missing from the topics is set
	// back to PENDING (with Replay), as walrelay poll retry does, and the
	// poller sends it again in its aggregate's order: behind the
	// aggregate's unsent rows that precede it, ahead of those that
	// follow it.
	Poll bool
	// OnMissing, if set, is called for each missing row, in id order.
	OnMissing func(Row)
}

// Reconciled is what a reconcile found.
type Reconciled struct {
	Rows         int // rows of the window judged
	Found        int // on their topic
	DeadLettered int // not on their topic, on the dead-letter topic
	// IDCut counts the rows that are on neither, but that a dead letter
	// whose id was cut (sink.HeaderIDOmitted) may name: an id that starts
	// with its prefix and is as long as its id was. Not judged: neither
	// missing (nor replayed) nor dead-lettered, as dlq replay does not
	// replay such a dead letter (its prefix may name another row).
	IDCut        int
	Missing      int // on neither
	NotJudged    int // committed after the reconcile started
	InFlight     int // with Poll: not sent yet by the poller (PENDING, SENDING, PARKED), not judged
	Requeued     int // with Poll and Replay: missing rows set back to PENDING for the poller
	Start        pglogrepl.LSN
	Confirmed    pglogrepl.LSN // the slot's, when the wait ended
	SlotCaughtUp bool          // the slot confirmed past Start: a missing row is not in flight
	SlotNote     string        // why not, if not
	Replayed     Sent
	// Trimmed says why records of published rows may be gone from the
	// topics read (trimmedTopics): a row counted missing may then only be
	// superseded or expired. Replay is refused when it is not empty and
	// rows count as missing.
	Trimmed []string
}

// ErrTrimmed refuses reconcile --replay on topics that lose records
// (Reconciled.Trimmed).
var ErrTrimmed = errors.New("reconcile --replay refused")

// querier is a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// topics returns the topics of the window's rows (from their routing
// fields) and the dead-letter topic.
func (rc *Reconciler) topics(ctx context.Context, q querier, cond string, args []any) ([]string, error) {
	t := rc.Table
	at, typ := t.ColumnText("", t.layout.Columns.AggregateType), t.ColumnText("", t.layout.Columns.Type)
	rows, err := q.Query(ctx, "SELECT DISTINCT "+at+", "+typ+" FROM "+t.name+" WHERE "+cond, args...)
	if err != nil {
		return nil, fmt.Errorf("read the window's aggregate types: %w", err)
	}
	defer rows.Close()
	set := map[string]bool{rc.DLQTopic: true}
	for rows.Next() {
		var a, ty *string
		if err := rows.Scan(&a, &ty); err != nil {
			return nil, err
		}
		e := &event.Event{}
		if a != nil {
			e.AggregateType = *a
		}
		if ty != nil {
			e.Type = *ty
		}
		set[rc.Publisher.Topic(e)] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the window's aggregate types: %w", err)
	}
	topics := make([]string, 0, len(set))
	for tp := range set {
		topics = append(topics, tp)
	}
	return topics, nil
}

// Trimmed says, before anything is moved or sent, why a reconcile with
// Replay of the window w could be refused: the notes that Run would put in
// Reconciled.Trimmed for the window's topics (a compacted topic, a topic
// whose log starts after offset 0), nil when there are none. Run refuses
// to replay when there are such notes and rows count as missing.
func (rc *Reconciler) Trimmed(ctx context.Context, w Window) ([]string, error) {
	cond, args, err := rc.Table.where(ctx, w)
	if err != nil {
		return nil, err
	}
	topics, err := rc.topics(ctx, rc.Table.conn, cond, args)
	if err != nil {
		return nil, err
	}
	since := w.Since
	if !since.IsZero() {
		margin := rc.Margin
		if margin <= 0 {
			margin = 5 * time.Minute
		}
		since = since.Add(-margin)
	}
	return trimmedTopics(ctx, rc.Kafka, topics, since)
}

// Run reconciles the window w. It takes a snapshot of the table, waits
// (up to Wait) for the slot to confirm past the WAL position of that
// moment, so that every row of the snapshot was published or
// dead-lettered unless it was lost, then reads the window's topics and
// the dead-letter topic and lists the rows on neither. It writes nothing
// to the database (a temporary table of the ids read is dropped with its
// transaction).
func (rc *Reconciler) Run(ctx context.Context, w Window) (Reconciled, error) {
	var res Reconciled
	t := rc.Table
	wait, margin := rc.Wait, rc.Margin
	if wait <= 0 {
		wait = 30 * time.Second
	}
	if margin <= 0 {
		margin = 5 * time.Minute
	}
	if rc.Poll {
		w.Sent = true
	}
	cond, args, err := t.where(ctx, w)
	if err != nil {
		return res, err
	}
	tx, err := t.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return res, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // it only read and made a temporary table
	// The snapshot is taken by the first query; the WAL insert position
	// after it is past every transaction it sees (currentLSN).
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+t.name+" WHERE "+cond, args...).Scan(&res.Rows); err != nil {
		return res, fmt.Errorf("count the window's rows: %w", err)
	}
	if err := tx.QueryRow(ctx, "SELECT "+currentLSN).Scan(lsnScanner{&res.Start}); err != nil {
		return res, fmt.Errorf("read the WAL position: %w", err)
	}
	// With Poll, the window's rows whatever their status.
	acond, aargs := cond, args
	if rc.Poll {
		all := w
		all.Sent = false
		if acond, aargs, err = t.where(ctx, all); err != nil {
			return res, err
		}
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+t.name+" WHERE "+acond+" AND NOT "+sentSQL, aargs...).Scan(&res.InFlight); err != nil {
			return res, fmt.Errorf("count the window's unsent rows: %w", err)
		}
	}
	if rc.Poll {
		// No slot publishes the rows: a row is SENT once Kafka acknowledged it.
		res.SlotCaughtUp = true
	} else {
		res.Confirmed, res.SlotCaughtUp, res.SlotNote = waitForSlots(ctx, tx, rc.Slot, rc.IgnoreSlots, res.Start, wait)
	}

	topics, err := rc.topics(ctx, tx, cond, args)
	if err != nil {
		return res, err
	}

	// The ids on the topics, into a temporary table.
	if _, err := tx.Exec(ctx, "CREATE TEMPORARY TABLE walrelay_seen (id text NOT NULL, dlq bool NOT NULL) ON COMMIT DROP"); err != nil {
		return res, fmt.Errorf("create a temporary table: %w", err)
	}
	since := w.Since
	if !since.IsZero() {
		since = since.Add(-margin)
	}
	if res.Trimmed, err = trimmedTopics(ctx, rc.Kafka, topics, since); err != nil {
		return res, err
	}
	batch := make([][]any, 0, 10000)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"walrelay_seen"}, []string{"id", "dlq"}, pgx.CopyFromRows(batch))
		batch = batch[:0]
		return err
	}
	// A dead letter whose id was cut holds a prefix of its row's id: not
	// the id of its row, and maybe another row's. It goes to
	// walrelay_cut, with the length of the whole id, not to walrelay_seen
	// (there it counted its row missing, and --replay republished it,
	// and counted a row whose id was the prefix dead-lettered).
	var cuts [][]any
	err = readTopics(ctx, rc.Kafka, topics, since, func(r *kgo.Record) error {
		id := sink.Header(r, "id")
		if id == "" {
			return nil
		}
		if r.Topic == rc.DLQTopic {
			if omitted := sink.Header(r, sink.HeaderIDOmitted); omitted != "" {
				n, err := strconv.Atoi(omitted)
				if err != nil || n < 0 {
					n = -1 // an unknown length: any id with the prefix
				}
				cuts = append(cuts, []any{id, n})
				return nil
			}
		}
		batch = append(batch, []any{id, r.Topic == rc.DLQTopic})
		if len(batch) == cap(batch) {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return res, fmt.Errorf("read the topics: %w", err)
	}
	if _, err := tx.Exec(ctx, "CREATE TEMPORARY TABLE walrelay_cut (prefix text NOT NULL, omitted int NOT NULL) ON COMMIT DROP"); err != nil {
		return res, fmt.Errorf("create a temporary table: %w", err)
	}
	if len(cuts) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"walrelay_cut"}, []string{"prefix", "omitted"}, pgx.CopyFromRows(cuts)); err != nil {
			return res, fmt.Errorf("read the topics: the dead letters whose id was cut: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, "CREATE INDEX ON walrelay_seen (id); ANALYZE walrelay_seen"); err != nil {
		return res, fmt.Errorf("index the ids read: %w", err)
	}
	id := t.name + "." + pgx.Identifier{t.layout.Columns.ID}.Sanitize() + "::text"
	onTopic := "EXISTS (SELECT 1 FROM walrelay_seen s WHERE s.id = " + id + " AND NOT s.dlq)"
	dead := "EXISTS (SELECT 1 FROM walrelay_seen s WHERE s.id = " + id + " AND s.dlq)"
	cut := "EXISTS (SELECT 1 FROM walrelay_cut c WHERE starts_with(" + id + ", c.prefix) AND (c.omitted < 0 OR octet_length(" + id + ") = octet_length(c.prefix) + c.omitted))"
	if err := tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE "+onTopic+"), count(*) FILTER (WHERE NOT "+onTopic+" AND "+dead+"), count(*) FILTER (WHERE NOT "+onTopic+" AND NOT "+dead+" AND "+cut+") FROM "+t.name+" WHERE "+cond, args...).
		Scan(&res.Found, &res.DeadLettered, &res.IDCut); err != nil {
		return res, fmt.Errorf("compare: %w", err)
	}
	// The window's rows were counted in this snapshot: the rest is missing.
	if missing := res.Rows - res.Found - res.DeadLettered - res.IDCut; rc.Replay && missing > 0 && len(res.Trimmed) > 0 {
		res.Missing = missing
		return res, fmt.Errorf("%w: %d rows count as missing, and %s; a row counted missing there may have been published; list them with reconcile without --replay, and send the rows you know are missing with walrelay replay --ids FILE", ErrTrimmed, missing, strings.Join(res.Trimmed, "; "))
	}
	var s *sender
	if rc.Replay && !rc.Poll {
		s = newSender(rc.Publisher, false)
	}
	var requeue []string
	w.extra = "NOT EXISTS (SELECT 1 FROM walrelay_seen s WHERE s.id = " + id + ") AND NOT " + cut
	err = t.Rows(ctx, tx, w, func(r Row) error {
		res.Missing++
		if rc.OnMissing != nil {
			rc.OnMissing(r)
		}
		if rc.Replay && rc.Poll {
			requeue = append(requeue, r.Event.ID)
		}
		if s != nil {
			return s.send(ctx, r.Event)
		}
		return nil
	})
	if s != nil {
		var serr error
		res.Replayed, serr = s.wait()
		if err == nil {
			err = serr
		}
	}
	if err != nil {
		return res, err
	}
	if err := tx.Rollback(ctx); err != nil {
		return res, fmt.Errorf("end the snapshot: %w", err)
	}
	if res.Requeued, err = t.requeue(ctx, requeue); err != nil {
		return res, err
	}
	var now int
	if err := t.conn.QueryRow(ctx, "SELECT count(*) FROM "+t.name+" WHERE "+acond, aargs...).Scan(&now); err != nil {
		return res, fmt.Errorf("count the window's rows: %w", err)
	}
	res.NotJudged = max(0, now-res.Rows-res.InFlight)
	return res, nil
}

// requeue sets the rows of ids that are still SENT or DEAD back to PENDING
// for the poll source's poller (a DEAD row with its attempts reset, as
// walrelay poll retry does), a batch of rows a transaction, and returns
// how many it set.
func (t *Table) requeue(ctx context.Context, ids []string) (int, error) {
	idCol := pgx.Identifier{t.layout.Columns.ID}.Sanitize()
	n := 0
	for len(ids) > 0 {
		b := ids[:min(len(ids), batchRows)]
		ids = ids[len(b):]
		tag, err := t.conn.Exec(ctx, "UPDATE "+t.name+" SET status = 'PENDING', available_at = now(), claim_id = NULL, lease_until = NULL, "+
			"attempts = CASE WHEN status = 'DEAD' THEN 0 ELSE attempts END WHERE "+idCol+"::text = ANY($1::text[]) AND "+sentSQL, b)
		if err != nil {
			return n, fmt.Errorf("set the missing rows back to PENDING: %w", err)
		}
		n += int(tag.RowsAffected())
	}
	return n, nil
}

// currentLSN is the WAL position past every transaction a snapshot taken
// before it sees: the insert position. A transaction committed with
// synchronous_commit off is visible once its commit record is in the WAL
// buffers, before the WAL writer writes it (up to three wal_writer_delay
// later), so the write position (pg_current_wal_lsn) can be behind its
// commit: a slot confirmed past that has not published it.
const currentLSN = "pg_current_wal_insert_lsn()::text"

// pageStart returns the start of lsn's page when lsn is the end of that
// page's header (SizeOfXLogLongPHD, 40 bytes, on a segment's first page,
// else SizeOfXLogShortPHD, 24), where the insert position of a server
// rests when its last record ended at the previous page's end; else lsn.
// No record ends there (the tail of a record continued from the previous
// page ends after at least one byte of data).
func pageStart(lsn pglogrepl.LSN, block, segment int64) pglogrepl.LSN {
	if block <= 0 || segment <= 0 {
		return lsn
	}
	header := int64(24)
	if int64(lsn)%segment < block {
		header = 40
	}
	if int64(lsn)%block == header {
		return lsn - pglogrepl.LSN(header)
	}
	return lsn
}

// waitForSlots waits, up to wait in all, until every logical slot of the
// database has confirmed past lsn: own (which must exist) and every other
// one but those of ignore. An outbox sharded over several slots (a row
// filter each) has each row published through one of them, and a slot of
// another reader of the table (Debezium, a second walrelay) has its rows
// too: which tables a slot reads is known only to its consumer, so every
// slot is waited for unless named in ignore. It returns the lowest
// position confirmed, and why not when it is not past lsn.
func waitForSlots(ctx context.Context, q pgx.Tx, own string, ignore []string, lsn pglogrepl.LSN, wait time.Duration) (pglogrepl.LSN, bool, string) {
	deadline := time.Now().Add(wait)
	rows, err := q.Query(ctx, "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() AND slot_name <> $1 AND NOT slot_name::text = ANY($2::text[]) ORDER BY slot_name", own, append([]string{}, ignore...))
	if err != nil {
		return 0, false, fmt.Sprintf("list the logical slots: %v", err)
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, false, fmt.Sprintf("list the logical slots: %v", err)
	}
	// The insert position of an idle server whose last record ended at a
	// page's end is past the next page's header, which no slot confirms
	// until another record comes: no commit ends within a header, so the
	// page's start is as good.
	var block, segment int64
	if err := q.QueryRow(ctx, "SELECT current_setting('wal_block_size')::int8, pg_size_bytes(current_setting('wal_segment_size'))").Scan(&block, &segment); err != nil {
		return 0, false, fmt.Sprintf("read wal_block_size: %v", err)
	}
	lsn = pageStart(lsn, block, segment)
	lowest, ok, note := waitForSlot(ctx, q, own, lsn, wait)
	if !ok {
		return lowest, false, note
	}
	for _, s := range others {
		c, ok, note := waitForSlot(ctx, q, s, lsn, max(time.Until(deadline), 0))
		if !ok {
			if strings.Contains(note, "does not exist") {
				continue // dropped meanwhile: it reads nothing more
			}
			return c, false, note + fmt.Sprintf(" (slot %s may read the outbox: every logical slot of the database is waited for; name one that does not with --ignore-slot %s)", s, s)
		}
		lowest = min(lowest, c)
	}
	return lowest, true, ""
}

// waitForSlot waits until slot has confirmed past lsn, up to wait. A slot
// the server invalidated (wal_status lost) never confirms again: it says
// so at once. A slot still behind at the deadline is said to be read by
// no one (not active) or to lag (active).
func waitForSlot(ctx context.Context, q pgx.Tx, slot string, lsn pglogrepl.LSN, wait time.Duration) (pglogrepl.LSN, bool, string) {
	deadline := time.Now().Add(wait)
	for {
		var confirmed *string
		var status string
		var active bool
		err := q.QueryRow(ctx, "SELECT confirmed_flush_lsn::text, coalesce(wal_status, ''), active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed, &status, &active)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false, fmt.Sprintf("slot %s does not exist: the rows are judged against the topics alone", slot)
		}
		if err != nil {
			return 0, false, fmt.Sprintf("read slot %s: %v", slot, err)
		}
		var c pglogrepl.LSN
		if confirmed != nil {
			c, _ = pglogrepl.ParseLSN(*confirmed)
		}
		if status == "lost" {
			return c, false, fmt.Sprintf("slot %s was invalidated (wal_status lost): the server removed WAL it still needed (max_slot_wal_keep_size), so it never confirms again, and rows committed after %s may be missing from Kafka; "+
				"recreate the slot (walrelay slot drop --yes, slot create) and republish what is missing (walrelay reconcile --since <a time before the loss> --replay --yes, or --all on a table without created_at, outbox.timestamp_column or only UUIDv7 ids; docs/operations.md: \"The slot was lost or dropped\") before pruning", slot, c)
		}
		if c >= lsn {
			return c, true, ""
		}
		if time.Now().After(deadline) {
			why := "no walrelay streams it (the slot is not active): start it"
			if active {
				why = "it is streamed (active) but behind: a missing row may still be in flight; wait, or give a longer --wait"
			}
			return c, false, fmt.Sprintf("slot %s confirmed %s, not yet past the start position %s after %s: %s", slot, c, lsn, wait, why)
		}
		select {
		case <-ctx.Done():
			return c, false, ctx.Err().Error()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lsnScanner scans an LSN's text.
type lsnScanner struct{ p *pglogrepl.LSN }

func (l lsnScanner) Scan(src any) error {
	s, ok := src.(string)
	if !ok {
		return fmt.Errorf("an LSN of type %T", src)
	}
	v, err := pglogrepl.ParseLSN(s)
	*l.p = v
	return err
}
