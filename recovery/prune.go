package recovery

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/sqlquote"
)

// MinPruneAge is the smallest age prune deletes: a reconcile or replay
// window that starts later than now minus the prune age still finds its
// rows.
const MinPruneAge = time.Hour

// Pruner deletes old rows of the outbox table.
type Pruner struct {
	Table *Table
	Slot  string
	// Ignore are logical slots of the database that do not read the
	// outbox table: not waited for. Every other one is: the slots of the
	// shards of a sharded outbox, another reader's.
	Ignore []string
	// Batch is how many rows a transaction deletes. Default 1000.
	Batch int
	// Wait bounds how long to wait for the slot to confirm past the
	// prune's start. Default 30s.
	Wait time.Duration
	// Dry counts what it would delete.
	Dry bool
	// SentOnly is for the poll source (no slot): only rows whose status is
	// SENT are deleted, and no slot is waited for.
	SentOnly bool
	// Progress, if set, is called after each batch.
	Progress func(deleted int)
}

// Pruned is what a prune did.
type Pruned struct {
	Cutoff       time.Time
	Deleted      int
	Batches      int
	LongestBatch time.Duration // the longest a batch's transaction held its row locks
	Took         time.Duration
	Confirmed    pglogrepl.LSN
	Start        pglogrepl.LSN
}

// Run deletes the rows older than olderThan, Batch at a time, in id order.
// With SentOnly it deletes the rows marked SENT more than olderThan ago.
// Else it deletes only rows
// whose transaction walrelay confirmed: it takes a
// snapshot, waits until its slot and every other logical slot of the
// database (but Ignore) confirmed past the WAL insert position of that
// moment (every transaction the snapshot sees committed before it, so
// walrelay published each row of it; the insert position, not the write
// position, covers a transaction committed with synchronous_commit off), and deletes in transactions that
// import that snapshot, so a row committed later (an old row of a long
// transaction) is not seen. It refuses when the slot does not catch up.
func (p *Pruner) Run(ctx context.Context, olderThan time.Duration) (Pruned, error) {
	res := Pruned{Cutoff: time.Now().Add(-olderThan)}
	if olderThan < MinPruneAge {
		return res, fmt.Errorf("--older-than %s: prune keeps at least %s of rows (for reconcile and replay windows)", olderThan, MinPruneAge)
	}
	batch, wait := p.Batch, p.Wait
	if batch <= 0 {
		batch = 1000
	}
	if wait <= 0 {
		wait = 30 * time.Second
	}
	t := p.Table
	w := Window{Until: res.Cutoff}
	if p.SentOnly {
		// Rows sent before the cutoff, whatever their own time.
		w = Window{All: true, extra: "status = 'SENT' AND sent_at < " + sqlquote.Literal(res.Cutoff.UTC().Format(time.RFC3339Nano)) + "::timestamptz"}
	}
	cond, args, err := t.where(ctx, w)
	if err != nil {
		return res, err
	}
	start := time.Now()
	snapshot := ""
	if !p.SentOnly {
		snap, err := t.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return res, fmt.Errorf("begin: %w", err)
		}
		// The snapshot lives as long as this transaction.
		defer snap.Rollback(context.Background()) //nolint:errcheck // read only
		if err := snap.QueryRow(ctx, "SELECT pg_export_snapshot(), "+currentLSN).Scan(&snapshot, lsnScanner{&res.Start}); err != nil {
			return res, fmt.Errorf("export a snapshot: %w", err)
		}
		var ok bool
		var note string
		res.Confirmed, ok, note = waitForSlots(ctx, snap, p.Slot, p.Ignore, res.Start, wait)
		if !ok {
			return res, fmt.Errorf("prune deletes only rows walrelay confirmed: %s", note)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, t.conn.Config())
	if err != nil {
		return res, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	id := pgx.Identifier{t.layout.Columns.ID}.Sanitize()
	cast := ""
	if t.idIsUUID {
		cast = "::uuid"
	}
	var last *string
	for {
		a := args
		sel := "SELECT " + id + " FROM " + t.name + " WHERE " + cond
		if last != nil {
			a = append(append([]any(nil), args...), *last)
			sel += fmt.Sprintf(" AND %s > $%d%s", id, len(a), cast)
		}
		sel += fmt.Sprintf(" ORDER BY %s LIMIT %d", id, batch)
		// The cursor is the batch's last id in the id's own order, as
		// text: max(id::text) is not that of bigint ids past a digit
		// boundary ("999" of 1 to 1,000).
		lastID := "(array_agg(" + id + " ORDER BY " + id + " DESC))[1]::text"
		q := "WITH d AS (DELETE FROM " + t.name + " WHERE " + id + " IN (" + sel + ") RETURNING " + id + ") SELECT count(*), " + lastID + " FROM d"
		if p.Dry {
			q = "SELECT count(*), " + lastID + " FROM (" + sel + ") d"
		}
		began := time.Now()
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return res, fmt.Errorf("begin: %w", err)
		}
		var n int
		var max *string
		if snapshot != "" {
			_, err = tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+sqlquote.Literal(snapshot)) // it takes no parameter
		}
		if err == nil {
			// Walk the primary key (see Table.Rows).
			_, err = tx.Exec(ctx, "SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off; SET LOCAL jit = off")
		}
		if err == nil {
			err = tx.QueryRow(ctx, q, a...).Scan(&n, &max)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(context.Background())
			return res, fmt.Errorf("prune %s (%d rows deleted so far): %w", t.Name(), res.Deleted, err)
		}
		if d := time.Since(began); d > res.LongestBatch {
			res.LongestBatch = d
		}
		if n == 0 {
			break
		}
		res.Deleted += n
		res.Batches++
		last = max
		if p.Progress != nil {
			p.Progress(res.Deleted)
		}
		if n < batch {
			break
		}
	}
	res.Took = time.Since(start)
	return res, nil
}
