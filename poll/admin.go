package poll

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/failure"
	"github.com/walrelay/walrelay/internal/sqlquote"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/relay"
)

// listen wakes the poller on each notification of one of its tables, on a
// connection of its own, until ctx ends; it connects again with backoff
// when the connection is lost (the poll interval covers what is missed).
func (p *Poller) listen(ctx context.Context) {
	mine := map[string]bool{}
	for _, l := range p.cfg.Outbox.Layouts() {
		mine[l.Name()] = true
	}
	for ctx.Err() == nil {
		conn, err := p.connect(ctx, false)
		if err != nil {
			return
		}
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{migrations.NotifyChannel}.Sanitize()); err != nil {
			conn.Close(context.Background())
			if ctx.Err() == nil {
				p.log.Warn("listen for the outbox's notifications", "err", err)
				time.Sleep(time.Second)
			}
			continue
		}
		p.wakeUp() // what was inserted before LISTEN
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() == nil {
					p.log.Warn("the notification connection was lost; connecting again", "err", err)
				}
				break
			}
			if mine[n.Payload] {
				p.wakeUp()
			}
		}
		conn.Close(context.Background())
	}
}

func (p *Poller) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// CheckTable checks that the outbox table of l has the columns walrelay
// reads and what the poll source needs: its columns (migrations.PollColumns),
// the status check (with PARKED), the three partial indexes and the notify
// trigger. An
// error is fatal and says to run walrelay migrate --poll.
func CheckTable(ctx context.Context, conn *pgx.Conn, l decoder.Layout) error {
	l = l.WithDefaults()
	names, cols, err := relay.TableColumns(ctx, conn, l.Schema, l.Table)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", l.Name(), err)
	}
	if len(names) == 0 {
		return failure.Mark(failure.Fatal, fmt.Errorf("outbox table %s does not exist (create it with walrelay migrate --poll)", l.Name()))
	}
	for _, need := range relay.Columns(l) {
		if _, ok := cols[need.Name]; !ok {
			return failure.Mark(failure.Fatal, fmt.Errorf("table %s has no column %q (%s); its columns are %s", l.Name(), need.Name, need.Key, strings.Join(names, ", ")))
		}
	}
	if err := relay.CheckVersionType(l, cols); err != nil {
		return failure.Mark(failure.Fatal, err)
	}
	var missing []string
	for _, c := range migrations.PollColumns {
		if _, ok := cols[c.Name]; !ok {
			missing = append(missing, "column "+c.Name)
		}
	}
	if err := migrations.CheckPollNames(l); err != nil {
		return failure.Mark(failure.Fatal, err)
	}
	n := migrations.PollNamesOf(l)
	q := pgx.Identifier{l.Schema, l.Table}.Sanitize()
	var hasCheck, checkParked, hasTrigger bool
	var indexes, invalid []string
	err = conn.QueryRow(ctx, `SELECT
		EXISTS (SELECT FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2),
		EXISTS (SELECT FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2 AND pg_get_constraintdef(oid) LIKE '%''PARKED''%'),
		EXISTS (SELECT FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $3 AND tgenabled <> 'D'),
		ARRAY(SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass),
		ARRAY(SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass AND NOT (i.indisvalid AND i.indisready))`,
		q, n.StatusCheck, n.Trigger).Scan(&hasCheck, &checkParked, &hasTrigger, &indexes, &invalid)
	if err != nil {
		return fmt.Errorf("read the poll objects of %s: %w", l.Name(), err)
	}
	switch {
	case !hasCheck:
		missing = append(missing, "constraint "+n.StatusCheck)
	case !checkParked:
		// An outbox migrated by an earlier version: the claims park rows
		// behind a blocked row of their aggregate, which its check refuses.
		missing = append(missing, "constraint "+n.StatusCheck+" allowing status PARKED")
	}
	for _, ix := range migrations.PollIndexes(l) {
		short := sqlquote.Cut(ix.Name) // PostgreSQL cuts names to 63 bytes
		switch {
		case !slices.Contains(indexes, short):
			// migrate --poll leaves it to build by hand on a large table.
			missing = append(missing, "index "+ix.Name+" (on a large table, build it without holding the writers: "+ix.Concurrently()+")")
		case slices.Contains(invalid, short):
			// A CREATE INDEX CONCURRENTLY that failed leaves the index
			// INVALID: the planner does not use it, and its IF NOT EXISTS
			// keeps it when run again.
			missing = append(missing, "a valid index "+ix.Name+" (it is INVALID, left by a failed concurrent build; the planner does not use it: "+ix.Rebuild()+")")
		}
	}
	if !hasTrigger {
		missing = append(missing, "trigger "+n.Trigger+" (enabled)")
	}
	// An outbox partitioned by LIST (status) must have a partition that
	// takes PARKED rows (one listing it, or a DEFAULT partition): else
	// every claim that parks a row fails.
	var byStatus, takesParked bool
	err = conn.QueryRow(ctx, `SELECT coalesce(pg_get_partkeydef($1::regclass) ~* '^LIST \("?status"?\)$', false),
		EXISTS (SELECT FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass
			AND (pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' OR pg_get_expr(c.relpartbound, c.oid) LIKE '%''PARKED''%'))`, q).Scan(&byStatus, &takesParked)
	if err != nil {
		return fmt.Errorf("read the partitions of %s: %w", l.Name(), err)
	}
	if byStatus && !takesParked {
		missing = append(missing, "a partition for status PARKED (the table is partitioned by LIST (status): CREATE TABLE ... PARTITION OF "+q+" FOR VALUES IN ('PARKED'), or a DEFAULT partition)")
	}
	if len(missing) > 0 {
		return failure.Mark(failure.Fatal, fmt.Errorf("table %s lacks what the poll source needs: %s (run walrelay migrate --poll)", l.Name(), strings.Join(missing, ", ")))
	}
	// The order of an aggregate's rows is created_at's: a default of the
	// transaction's time gives one transaction's rows one time, and their
	// ids would order them.
	def, err := migrations.ColumnDefault(ctx, conn, q, "created_at")
	if err != nil {
		return err
	}
	if migrations.TransactionTime(def) {
		return failure.Mark(failure.Fatal, fmt.Errorf("table %s: created_at defaults to %s, the time of the transaction, so the rows of one transaction would share it and go out in the order of their ids, not the order they were inserted in: it must default to clock_timestamp() (run walrelay migrate --poll, or ALTER TABLE %s ALTER COLUMN created_at SET DEFAULT clock_timestamp())", l.Name(), def, q))
	}
	return nil
}

// Stats are a table's rows by state, for metrics and status.
type Stats struct {
	Table string `json:"table"`
	// Due rows may be claimed now; OldestDueSeconds is the age of the
	// oldest of them (by created_at), 0 when none; rows of unknown time
	// (migrations.CreatedAtUnknown: in the table before migrate added
	// created_at) are not counted in it.
	Due              int64   `json:"due_rows"`
	OldestDueSeconds float64 `json:"oldest_due_seconds"`
	Pending          int64   `json:"pending_rows"`
	Sending          int64   `json:"sending_rows"`
	// ExpiredLeases are SENDING rows whose lease ended: their worker is
	// gone or stalled, and another claims them.
	ExpiredLeases int64 `json:"expired_leases"`
	Dead          int64 `json:"dead_rows"`
	// Parked rows wait behind a blocked row of their aggregate (in
	// backoff, or DEAD under on_dead block), out of the claims' index.
	Parked int64 `json:"parked_rows"`
}

// ReadStats reads the unsent rows of each table of o by state.
func ReadStats(ctx context.Context, conn *pgx.Conn, o decoder.Config) ([]Stats, error) {
	var out []Stats
	for _, l := range o.WithDefaults().Layouts() {
		s := Stats{Table: l.Name()}
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE `+dueSQL("o")+`),
			COALESCE(extract(epoch FROM now() - min(created_at) FILTER (WHERE `+dueSQL("o")+` AND NOT `+migrations.UnknownTimeSQL("created_at")+`))::float8, 0),
			count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE status = 'SENDING'),
			count(*) FILTER (WHERE status = 'SENDING' AND lease_until <= now()), count(*) FILTER (WHERE status = 'DEAD'),
			count(*) FILTER (WHERE status = 'PARKED')
			FROM `+pgx.Identifier{l.Schema, l.Table}.Sanitize()+` o WHERE status <> 'SENT'`).
			Scan(&s.Due, &s.OldestDueSeconds, &s.Pending, &s.Sending, &s.ExpiredLeases, &s.Dead, &s.Parked)
		if err != nil {
			return nil, fmt.Errorf("read the rows of %s by state: %w", l.Name(), err)
		}
		out = append(out, s)
	}
	return out, nil
}

// DeadRow is a DEAD row of an outbox table.
type DeadRow struct {
	ID            string    `json:"id"`
	AggregateType string    `json:"aggregatetype"`
	AggregateID   string    `json:"aggregateid"`
	Type          string    `json:"type"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

// Dead lists the DEAD rows of l's table in insert order, at most limit.
func Dead(ctx context.Context, conn *pgx.Conn, l decoder.Layout, limit int) ([]DeadRow, error) {
	l = l.WithDefaults()
	c := l.Columns
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	text := func(s string) string { return "coalesce(" + id(s) + "::text, '')" }
	rows, err := conn.Query(ctx, `SELECT `+id(c.ID)+`::text, `+text(c.AggregateType)+`, `+text(c.AggregateID)+`, `+text(c.Type)+`,
		attempts, COALESCE(last_error, ''), created_at FROM `+pgx.Identifier{l.Schema, l.Table}.Sanitize()+`
		WHERE status = 'DEAD' ORDER BY created_at, `+id(c.ID)+` LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read the dead rows of %s: %w", l.Name(), err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadRow, error) {
		var d DeadRow
		err := r.Scan(&d.ID, &d.AggregateType, &d.AggregateID, &d.Type, &d.Attempts, &d.LastError, &d.CreatedAt)
		return d, err
	})
}

// Retry sets DEAD rows of l's table back to PENDING with their attempts
// reset: the rows of ids, or with all every DEAD row. dry only counts
// them. It returns how many rows it set (or would set), and the ids given
// that are not DEAD rows.
func Retry(ctx context.Context, conn *pgx.Conn, l decoder.Layout, ids []string, all, dry bool) (int64, []string, error) {
	l = l.WithDefaults()
	if !all && len(ids) == 0 {
		return 0, nil, errors.New("say which rows: --id ID (repeatable) or --all")
	}
	idCol := pgx.Identifier{l.Columns.ID}.Sanitize()
	q := pgx.Identifier{l.Schema, l.Table}.Sanitize()
	cond := "status = 'DEAD'"
	args := []any{}
	if !all {
		cond += " AND " + idCol + "::text = ANY($1::text[])"
		args = append(args, ids)
	}
	var n int64
	var found []string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT "+idCol+"::text FROM "+q+" WHERE "+cond+" FOR UPDATE", args...)
		if err != nil {
			return err
		}
		found, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		n = int64(len(found))
		if dry || n == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, "UPDATE "+q+" SET status = 'PENDING', attempts = 0, available_at = now(), claim_id = NULL, lease_until = NULL WHERE "+cond, args...)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("retry the dead rows of %s: %w", l.Name(), err)
	}
	var notDead []string
	if !all {
		have := map[string]bool{}
		for _, f := range found {
			have[f] = true
		}
		for _, x := range ids {
			if !have[x] {
				notDead = append(notDead, x)
			}
		}
	}
	return n, notDead, nil
}
