package poll

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/recovery"
)

// table is one outbox table and the poller's statements on it.
type table struct {
	rt       *recovery.Table
	name     string // schema.table
	claimSQL string
	// releaseSQL sets PARKED rows back to PENDING (see newTable).
	releaseSQL string
	// releaseMarkedSQL releases the parked rows of the aggregates of the
	// rows a mark changed ($1, ids); empty with ordering none.
	releaseMarkedSQL string
	// swept is when release last ran (the poller's goroutine only).
	swept time.Time
	// sweepSQL and sweepFromSQL release the parked rows of the first
	// sweepCap aggregates with parked rows whose first unsent row is
	// PARKED, from the first aggregate or from after the cursor
	// (ordering aggregate only; see newTable). sweepFromSQL's
	// {{aggtype}} is resolved on the first sweep (aggType).
	sweepSQL, sweepFromSQL string
	sweepCap               int
	// sweepSpan is how many aggregates the next sweep visits (and rows it
	// sets back at most): sweepCap, halved by each sweep cut by
	// sweepTimeout, doubled back by each that was not (the poller's
	// goroutine only; 0 before the first sweep).
	sweepSpan int
	// nextParkedSQL is the first aggregate with parked rows after $1: the
	// cursor's step past an aggregate a sweep of it alone cannot release
	// within sweepTimeout ({{aggtype}} as in sweepFromSQL).
	nextParkedSQL string
	aggType       string
	// cursor is the last aggregate the last sweep visited (text), nil to
	// start from the first (the poller's goroutine only).
	cursor    *string
	renewSQL  string
	markSQL   string
	batch     int
	maxBytes  int64
	maxEvent  int64 // a row larger (its columns' text) is not read: it is dead-lettered too_large
	leaseSecs float64
}

// parkBatches bounds the rows one claim parks, in batches (BatchSize).
const parkBatches = 10

// dueSQL is the condition of a row that may be claimed, of the table
// aliased a.
func dueSQL(a string) string {
	return "((" + a + ".status = 'PENDING' AND " + a + ".available_at <= now()) OR (" + a + ".status = 'SENDING' AND " + a + ".lease_until <= now()))"
}

func newTable(rt *recovery.Table, cfg Config) *table {
	l := rt.Layout()
	t := &table{rt: rt, name: l.Name(), batch: cfg.BatchSize, maxBytes: int64(cfg.MaxBatchBytes), maxEvent: cfg.MaxEventBytes, leaseSecs: cfg.Lease.Seconds()}
	q := pgx.Identifier{l.Schema, l.Table}.Sanitize()
	id := pgx.Identifier{l.Columns.ID}.Sanitize()
	agg := pgx.Identifier{l.Columns.AggregateID}.Sanitize()
	idType := rt.IDType()
	// Order per aggregate: a due row c may be claimed when every earlier
	// unsent row of its aggregate is claimed in the same batch, ahead of
	// it. Two tests, each an index probe of the unsent rows by aggregate
	// (unsent: not SENT, nor DEAD unless DEAD blocks):
	//   - before the LIMIT, c is passed over when the first unsent row of
	//     its aggregate precedes it and is not due (SENDING under a live
	//     lease, PENDING in backoff, DEAD when it blocks), so that a held
	//     aggregate's backlog does not fill the batch;
	//   - after it, c is left out when an unsent row of its aggregate
	//     that the batch lacks (locked by another claim, or held back)
	//     precedes it.
	//
	// Parking: a due PENDING row behind a blocked row of its aggregate (the
	// first unsent row precedes it and is in backoff, DEAD when DEAD
	// blocks, or PARKED) cannot be claimed until that row is sent, and a
	// claim would otherwise walk it, and probe its aggregate, every time:
	// a blocked aggregate's backlog would cost every claim its length. The
	// claim sets the rows it passed over for that reason PARKED (among the
	// due rows up to the last row it locked: the range it walked), which
	// takes them out of the due index (status PENDING or SENDING), at most
	// parkBatches batches of them: parking is an update of each row, and
	// a claim that parked a backlog of millions at once could outlive its
	// timeout and park nothing, for ever; the rows left are parked by the
	// next claims, each walking fewer of them. A row under a live lease
	// (SENDING, claimed by another worker) parks the rows behind it too:
	// a lease is renewed for as long as Kafka does not answer (an outage
	// of minutes), and every claim of the other workers would walk them
	// meanwhile. They are released as any parked row, once the first
	// unsent row of their aggregate is PARKED: the leased row was SENT (or
	// DEAD under on_dead skip); set back to PENDING in backoff, or claimed
	// again after its lease ended, it still blocks them. The cost: two
	// more updates (park, release) of a row that another worker's claim
	// meets behind an aggregate in flight. Parking is no part of the order:
	// a PARKED row is unsent and not due, so it holds the later rows of
	// its aggregate as any such row does, and the two tests above decide
	// alone which rows are claimed.
	first, held, ok, park := "", "", "SELECT _wr_id, _wr_prev, _wr_size FROM cand", ""
	// Release: once the first unsent row of an aggregate is PARKED (the
	// rows before it sent, DEAD with on_dead skip, or deleted), its first
	// parked rows (as many as a batch) are set back to PENDING, in a
	// statement of their own before each claim (release). It is checked
	// for each aggregate that has parked rows (a skip scan of the parked
	// index), not set off by the mark that sends the blocked row: two
	// workers' claims and marks race, and a row parked by one while
	// another sent the row before it is released by the next round all
	// the same. Ordering none parks nothing and releases every parked row
	// (left by an earlier setting).
	//
	// A release sets back at most parkBatches batches of rows in all, as a
	// claim parks at most that many: the end of an outage, on_dead switched
	// from block to skip, or poll retry --all can unblock every aggregate
	// at once, and one statement that set back a batch of each could
	// outlive the round's timeout, and fail again every round. The
	// aggregates left are released by the next sweeps: those released
	// already are no longer free (their first unsent row is PENDING), so
	// each release goes on where the last one stopped.
	t.releaseSQL = `UPDATE ` + q + ` SET status = 'PENDING'
	WHERE ` + id + ` = ANY (ARRAY(SELECT p.` + id + ` FROM ` + q + ` p WHERE p.status = 'PARKED' LIMIT ` + strconv.Itoa(parkBatches*cfg.BatchSize) + ` FOR UPDATE SKIP LOCKED))`
	if cfg.Ordering == OrderAggregate {
		unsent := "e.status <> 'SENT'"
		if cfg.OnDead != DeadBlock {
			unsent += " AND e.status <> 'DEAD'"
		}
		first = ` AND NOT EXISTS (SELECT 1 FROM (SELECT e.status, e.available_at, e.lease_until, e.created_at, e.` + id + ` FROM ` + q + ` e
				WHERE e.` + agg + ` = c.` + agg + ` AND ` + unsent + ` ORDER BY e.created_at, e.` + id + ` LIMIT 1) f
			WHERE NOT ` + dueSQL("f") + ` AND (f.created_at, f.` + id + `) < (c.created_at, c.` + id + `))`
		held = `, held AS MATERIALIZED (
		SELECT a._wr_agg, f.created_at AS _wr_at, f.` + id + ` AS _wr_id FROM (SELECT DISTINCT _wr_agg FROM cand) a
		CROSS JOIN LATERAL (SELECT e.created_at, e.` + id + ` FROM ` + q + ` e
			WHERE e.` + agg + ` = a._wr_agg AND ` + unsent + ` AND e.` + id + ` NOT IN (SELECT _wr_id FROM cand)
			ORDER BY e.created_at, e.` + id + ` LIMIT 1) f
	)`
		blocked := `EXISTS (SELECT 1 FROM (SELECT e.status, e.available_at, e.lease_until, e.created_at, e.` + id + ` FROM ` + q + ` e
				WHERE e.` + agg + ` = c.` + agg + ` AND ` + unsent + ` ORDER BY e.created_at, e.` + id + ` LIMIT 1) f
			WHERE (f.created_at, f.` + id + `) < (c.created_at, c.` + id + `)
				AND (f.status IN ('DEAD', 'PARKED') OR (f.status = 'PENDING' AND f.available_at > now())
					OR (f.status = 'SENDING' AND f.lease_until > now())))`
		park = `, bound AS MATERIALIZED (
		SELECT CASE WHEN count(*) >= $1 THEN max(_wr_at) ELSE 'infinity' END AS _wr_at FROM locked
	), topark AS MATERIALIZED (
		SELECT c.` + id + ` AS _wr_id FROM ` + q + ` c
		WHERE c.status = 'PENDING' AND c.available_at <= now() AND c.created_at <= (SELECT _wr_at FROM bound)
			AND c.` + id + ` NOT IN (SELECT _wr_id FROM locked) AND ` + blocked + `
		LIMIT ` + strconv.Itoa(parkBatches*cfg.BatchSize) + `
		FOR UPDATE SKIP LOCKED
	), parked AS (
		UPDATE ` + q + ` SET status = 'PARKED' WHERE ` + id + ` = ANY (ARRAY(SELECT _wr_id FROM topark))
	)`
		// The three statements that release parked rows share their
		// parts: firstParked(a) holds when the first unsent row of
		// aggregate a is PARKED (a free aggregate), release(limit) is the
		// CTE rel of the first parked rows (limit of them) of each free
		// aggregate, at most parkBatches batches in all, and setBack the
		// update that sets rel's rows back to PENDING.
		firstParked := func(a string) string {
			return `(SELECT e.status FROM ` + q + ` e
			WHERE e.` + agg + ` = ` + a + ` AND ` + unsent + ` ORDER BY e.created_at, e.` + id + ` LIMIT 1) = 'PARKED'`
		}
		release := func(limit, total string) string {
			return `rel AS (
		SELECT r._wr_id FROM free CROSS JOIN LATERAL (SELECT p.` + id + ` AS _wr_id FROM ` + q + ` p
			WHERE p.` + agg + ` = free.a AND p.status = 'PARKED' ORDER BY p.created_at, p.` + id + ` LIMIT ` + limit + ` FOR UPDATE SKIP LOCKED) r
		LIMIT ` + total + `
	)`
		}
		bound := strconv.Itoa(parkBatches * cfg.BatchSize)
		setBack := `UPDATE ` + q + ` SET status = 'PENDING' WHERE ` + id + ` = ANY (ARRAY(SELECT _wr_id FROM rel))`
		// The sweep visits at most $3 aggregates with parked rows (the
		// span: sweepAggs, less after a sweep cut by its timeout), from
		// after the last one the previous sweep visited (a per-table
		// cursor, $2, in the aggregate column's type, {{aggtype}}, read on
		// the first sweep), and starts again from the first once it
		// reached the last: with many aggregates blocked (a topic refusing
		// its records), a sweep that walked them all would cost the round
		// their number once a second. It sets back at most $3 rows, at
		// most $1 of an aggregate.
		sweep := func(from string) string {
			return `WITH RECURSIVE aggs(a, n) AS (
		(SELECT p.` + agg + `, 1 FROM ` + q + ` p WHERE p.status = 'PARKED'` + from + ` ORDER BY p.` + agg + ` LIMIT 1)
		UNION ALL
		SELECT (SELECT p.` + agg + ` FROM ` + q + ` p WHERE p.status = 'PARKED' AND p.` + agg + ` > aggs.a ORDER BY p.` + agg + ` LIMIT 1), aggs.n + 1
		FROM aggs WHERE aggs.a IS NOT NULL AND aggs.n < $3
	), free AS (
		SELECT aggs.a FROM aggs WHERE aggs.a IS NOT NULL AND ` + firstParked("aggs.a") + `
	), ` + release("$1", "$3") + `, upd AS (
		` + setBack + ` RETURNING 1
	)
	SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM aggs WHERE a IS NOT NULL), (SELECT a::text FROM aggs WHERE a IS NOT NULL ORDER BY n DESC LIMIT 1)`
		}
		t.sweepSQL = strings.ReplaceAll(sweep(""), "$3", "$2")
		t.sweepFromSQL = sweep(" AND p." + agg + " > $2::text::{{aggtype}}")
		t.sweepCap = sweepAggs(cfg.BatchSize)
		t.nextParkedSQL = `SELECT p.` + agg + `::text FROM ` + q + ` p WHERE p.status = 'PARKED' AND ($1::text IS NULL OR p.` + agg + ` > $1::text::{{aggtype}}) ORDER BY p.` + agg + ` LIMIT 1`
		t.releaseSQL = `WITH RECURSIVE aggs(a) AS (
		(SELECT p.` + agg + ` FROM ` + q + ` p WHERE p.status = 'PARKED' ORDER BY p.` + agg + ` LIMIT 1)
		UNION ALL
		SELECT (SELECT p.` + agg + ` FROM ` + q + ` p WHERE p.status = 'PARKED' AND p.` + agg + ` > aggs.a ORDER BY p.` + agg + ` LIMIT 1)
		FROM aggs WHERE aggs.a IS NOT NULL
	), free AS (
		SELECT aggs.a FROM aggs WHERE aggs.a IS NOT NULL AND ` + firstParked("aggs.a") + `
	), ` + release("$1", bound) + `
	` + setBack
		// Release from the mark: once a mark committed, the aggregates of
		// the rows it changed whose first unsent row is PARKED (the row that
		// blocked them was just sent, or DEAD under on_dead skip) have their
		// first parked rows set back, in a statement of its own, so that the
		// next claim takes them: the sweep above (releaseSQL), which walks
		// every aggregate with parked rows, then runs only once per
		// sweepEvery, for what the mark cannot see: a row parked by another
		// worker's claim while the mark ran, a block ended outside the
		// poller (dlq replay's mark, a DELETE, on_dead switched to skip).
		t.releaseMarkedSQL = `WITH free AS (
		SELECT a.a FROM (SELECT DISTINCT m.` + agg + ` AS a FROM ` + q + ` m WHERE m.` + id + ` = ANY($1::text[]::` + idType + `[])) a
		WHERE ` + firstParked("a.a") + `
	), ` + release("$2", bound) + `
	` + setBack
		// A window over the batch and the blockers, by aggregate in
		// order: a row is held back when a blocker comes before it.
		ok = `SELECT _wr_id, _wr_prev, _wr_size FROM (
			SELECT u._wr_id, u._wr_prev, u._wr_size, bool_or(u._wr_blocker) OVER (PARTITION BY u._wr_agg ORDER BY u._wr_at, u._wr_id ROWS UNBOUNDED PRECEDING) AS _wr_held
			FROM (SELECT _wr_id, _wr_agg, _wr_at, _wr_prev, _wr_size, false AS _wr_blocker FROM cand
				UNION ALL SELECT _wr_id, _wr_agg, _wr_at, NULL, NULL, true FROM held) u
		) w WHERE NOT w._wr_held`
	}
	// The batch is also cut where its rows (every column's text) pass
	// maxBytes (the first row always goes): what a claim holds in memory
	// stays bounded whatever the rows' size. The rows cut off come after every row
	// kept, so they hold none back; their locks end with the statement.
	locked, returned := rt.SelectTexts("c"), rt.SelectTexts(q)
	t.claimSQL = `WITH locked AS (
		SELECT c.` + id + ` AS _wr_id, c.` + agg + ` AS _wr_agg, c.created_at AS _wr_at, c.status AS _wr_prev,
			` + recovery.SizeSQL(locked) + ` AS _wr_size
		FROM ` + q + ` c
		WHERE c.status IN ('PENDING', 'SENDING') AND ` + dueSQL("c") + first + `
		ORDER BY c.created_at, c.` + id + `
		LIMIT $1
		FOR UPDATE SKIP LOCKED
	), cand AS MATERIALIZED (
		SELECT _wr_id, _wr_agg, _wr_at, _wr_prev, _wr_size FROM (
			SELECT *, sum(_wr_size) OVER (ORDER BY _wr_at, _wr_id ROWS UNBOUNDED PRECEDING) - _wr_size AS _wr_before FROM locked
		) s WHERE _wr_before < $4
	)` + held + park + `, ok AS (` + ok + `)
	UPDATE ` + q + ` SET status = 'SENDING', claim_id = $2, lease_until = now() + make_interval(secs => $3), attempts = attempts + 1
	FROM ok WHERE ` + q + `.` + id + ` = ok._wr_id
	RETURNING ok._wr_prev, attempts::text, (extract(epoch FROM created_at) * 1000000)::int8::text, ` + q + `.` + id + `::text, ok._wr_size::text, ` + rt.CappedList(returned, "ok._wr_size", "$5::int8")
	t.renewSQL = `UPDATE ` + q + ` SET lease_until = now() + make_interval(secs => $3)
	WHERE ` + id + ` = ANY($1::text[]::` + idType + `[]) AND claim_id = $2 AND status = 'SENDING'`
	t.markSQL = `UPDATE ` + q + ` AS t SET status = m.st,
		sent_at = CASE WHEN m.st = 'SENT' THEN now() ELSE t.sent_at END,
		available_at = CASE WHEN m.st = 'PENDING' THEN now() + make_interval(secs => m.delay) ELSE t.available_at END,
		attempts = t.attempts - m.undo,
		last_error = COALESCE(NULLIF(m.err, ''), t.last_error),
		lease_until = NULL
	FROM unnest($1::text[], $2::text[], $3::float8[], $4::int4[], $5::text[]) AS m(id, st, delay, undo, err)
	WHERE t.` + id + ` = m.id::` + idType + ` AND t.claim_id = $6 AND t.status = 'SENDING'`
	return t
}

// claim claims due rows under claim and returns them in insert order with
// how many had an expired lease. It is one statement, so one transaction
// that commits before the rows are published.
func (t *table) claim(ctx context.Context, conn *pgx.Conn, claim string) ([]*row, int, error) {
	var out []*row
	expired := 0
	rows, err := conn.Query(ctx, t.claimSQL, t.batch, claim, t.leaseSecs, t.maxBytes, t.maxEvent)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		raw := rows.RawValues()
		r := &row{t: t, claim: claim, id: string(raw[3])}
		if string(raw[0]) == "SENDING" {
			expired++
		}
		if r.attempts, err = strconv.Atoi(string(raw[1])); err != nil {
			return nil, 0, fmt.Errorf("attempts %q: %w", raw[1], err)
		}
		us, err := strconv.ParseInt(string(raw[2]), 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("created_at %q: %w", raw[2], err)
		}
		r.created = time.UnixMicro(us)
		if r.e, err = t.rt.Event(raw[5:]); err != nil {
			return nil, 0, err
		}
		if size, _ := strconv.ParseInt(string(raw[4]), 10, 64); size > t.maxEvent {
			// Its columns were left out by the claim (CappedList): the row
			// is dead-lettered without them, as the WAL source does.
			r.e.Payload, r.e.OmittedBytes = nil, size
			r.e.Invalid = recovery.TooLargeError(size, t.maxEvent)
		}
		// The header walrelay.commit_time carries the insert time: the
		// poll source knows no commit. A row that was in the table when
		// migrate added created_at has none (CreatedAtUnknown): no time.
		if !migrations.UnknownTime(r.created) {
			r.e.CommitTime = r.created
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	sortRows(out)
	return out, expired, nil
}

// sweepAggs is how many aggregates with parked rows one sweep visits, for
// a batch size: parkBatches batches' worth.
func sweepAggs(batch int) int { return parkBatches * batch }

// sweepTimeout bounds one sweep (statement_timeout): it runs in the round,
// before a claim, and must never delay it long. A sweep cut by it releases
// nothing (one statement), so the next one visits half as many aggregates
// from the same cursor, and one of a single aggregate cut steps the cursor
// past it: the sweeps go on through the aggregates whatever one costs. The
// mark releases the aggregates it sends all the same.
const sweepTimeout = 500 * time.Millisecond

// sweep sets back to PENDING the parked rows of the aggregates no longer
// blocked among the next sweepSpan aggregates with parked rows (from after
// the cursor, wrapping around), at most a batch of each and sweepSpan rows
// in all (sweepCap: parkBatches batches), under sweepTimeout, and returns
// how many. A sweep cut by sweepTimeout returns its error, having halved
// the span (or, at one aggregate, moved the cursor past it); one that was
// not doubles it back up to sweepCap. Ordering none has no cursor: it is
// release.
func (t *table) sweep(ctx context.Context, conn *pgx.Conn) (int64, error) {
	if t.sweepSQL == "" {
		return t.release(ctx, conn)
	}
	if t.aggType == "" {
		l := t.rt.Layout()
		err := conn.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2`,
			pgx.Identifier{l.Schema, l.Table}.Sanitize(), l.Columns.AggregateID).Scan(&t.aggType)
		if err != nil {
			return 0, fmt.Errorf("read the type of %s.%s: %w", t.name, l.Columns.AggregateID, err)
		}
	}
	if t.sweepSpan == 0 {
		t.sweepSpan = t.sweepCap
	}
	span := t.sweepSpan
	var released, visited int64
	var last *string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", sweepTimeout.Milliseconds())); err != nil {
			return err
		}
		var row pgx.Row
		if t.cursor == nil {
			row = tx.QueryRow(ctx, t.sweepSQL, min(t.batch, span), span)
		} else {
			row = tx.QueryRow(ctx, strings.ReplaceAll(t.sweepFromSQL, "{{aggtype}}", t.aggType), min(t.batch, span), *t.cursor, span)
		}
		return row.Scan(&released, &visited, &last)
	})
	if err != nil {
		if !isStatementTimeout(err) {
			return 0, err
		}
		if span > 1 {
			t.sweepSpan = span / 2
			return 0, fmt.Errorf("sweep of %d aggregates with parked rows cut (the next visits %d): %w", span, t.sweepSpan, err)
		}
		if serr := t.skipParked(ctx, conn); serr != nil {
			return 0, errors.Join(err, serr)
		}
		return 0, fmt.Errorf("sweep of one aggregate with parked rows cut (the next starts after it): %w", err)
	}
	t.sweepSpan = min(t.sweepCap, 2*span)
	t.cursor = last
	if visited < int64(span) {
		t.cursor = nil // the last aggregate reached: from the first again
	}
	return released, nil
}

// skipParked moves the cursor past the first aggregate with parked rows
// after it (to the first one again past the last).
func (t *table) skipParked(ctx context.Context, conn *pgx.Conn) error {
	var next *string
	err := conn.QueryRow(ctx, strings.ReplaceAll(t.nextParkedSQL, "{{aggtype}}", t.aggType), t.cursor).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		next, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("step the sweep's cursor past %s: %w", t.name, err)
	}
	t.cursor = next
	return nil
}

// isStatementTimeout reports whether err is the server's cancel of a
// statement (57014 query_canceled: statement_timeout).
func isStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// release sets back to PENDING the parked rows whose aggregate is no
// longer blocked (at most a batch of each, parkBatches batches in all),
// every aggregate with parked rows visited, and returns how many (ordering
// none; with ordering aggregate the poller's round sweeps instead).
func (t *table) release(ctx context.Context, conn *pgx.Conn) (int64, error) {
	args := []any{t.batch}
	if !strings.Contains(t.releaseSQL, "$1") {
		args = nil
	}
	tag, err := conn.Exec(ctx, t.releaseSQL, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// sweepEvery is how often the poller runs the release of every
// aggregate's parked rows (release) before a claim; the mark releases
// those of the aggregates it sends (releaseMarked) at once.
const sweepEvery = time.Second

// releaseMarked releases the parked rows of the aggregates of ids (the
// rows a mark changed) whose first unsent row is PARKED, at most a batch
// each, and returns how many.
func (t *table) releaseMarked(ctx context.Context, conn *pgx.Conn, ids []string) (int64, error) {
	if t.releaseMarkedSQL == "" || len(ids) == 0 {
		return 0, nil
	}
	tag, err := conn.Exec(ctx, t.releaseMarkedSQL, ids, t.batch)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// renew extends the leases of c's rows that c still holds.
func (t *table) renew(ctx context.Context, conn *pgx.Conn, c *claimed) error {
	ids := make([]string, len(c.rows))
	for i, r := range c.rows {
		ids[i] = r.id
	}
	_, err := conn.Exec(ctx, t.renewSQL, ids, c.claim, t.leaseSecs)
	return err
}

// mark applies m to the rows that claim still holds, and returns how many
// it changed.
func (t *table) mark(ctx context.Context, conn *pgx.Conn, claim string, m *marks) (int64, error) {
	tag, err := conn.Exec(ctx, t.markSQL, m.ids, m.statuses, m.delays, m.undo, m.errs, claim)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
