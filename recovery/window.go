package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/migrations"
)

// Window selects rows of the outbox table.
type Window struct {
	// Since and Until bound the rows' time, Since included, Until not;
	// zero: unbounded on that side.
	Since, Until time.Time
	// AggregateType, if set, selects rows of that aggregate type only.
	AggregateType string
	// IDs, if set, selects these ids only.
	IDs []string
	// All selects the whole table (with AggregateType, if set).
	All bool
	// Sent, for an outbox of the poll source, selects only the rows its
	// poller considers sent (status SENT or DEAD): the others (PENDING,
	// SENDING, PARKED) are its own to send, in each aggregate's order,
	// and a tool that sent one would send it ahead of an earlier unsent
	// row of its aggregate.
	Sent bool

	extra string // a further SQL condition, of the tools' own
}

func (w Window) timed() bool { return !w.Since.IsZero() || !w.Until.IsZero() }

// where returns the window's condition and arguments, and refuses what the
// table cannot select.
func (t *Table) where(ctx context.Context, w Window) (string, []any, error) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	id := pgx.Identifier{t.layout.Columns.ID}.Sanitize()
	if !w.Since.IsZero() && !w.Until.IsZero() && !w.Until.After(w.Since) {
		return "", nil, fmt.Errorf("the window ends (%s) before it starts (%s)", w.Until.Format(time.RFC3339), w.Since.Format(time.RFC3339))
	}
	if w.timed() {
		if t.timeColumn != "" {
			ts := pgx.Identifier{t.timeColumn}.Sanitize()
			// A row of unknown time (created_at CreatedAtUnknown, before
			// any window) whose id is a UUIDv7 is placed by its id's
			// time. Each side stays a range of the created_at index, or
			// two.
			unknownV7 := ""
			if t.unknownTimes && t.idIsUUID {
				unknownV7 = migrations.UnknownTimeSQL(ts) + " AND " + id + "::text ~ '" + v7Pattern + "'"
			}
			if !w.Since.IsZero() {
				if unknownV7 != "" {
					conds = append(conds, "("+ts+" >= "+arg(w.Since)+" OR ("+unknownV7+" AND "+id+" >= "+arg(uuidAt(w.Since))+"::uuid))")
				} else {
					conds = append(conds, ts+" >= "+arg(w.Since))
				}
			}
			if !w.Until.IsZero() {
				conds = append(conds, ts+" < "+arg(w.Until))
				if unknownV7 != "" {
					conds = append(conds, "NOT ("+unknownV7+" AND "+id+" >= "+arg(uuidAt(w.Until))+"::uuid)")
				}
			}
		} else {
			if err := t.checkUUIDv7(ctx); err != nil {
				return "", nil, err
			}
			if !w.Since.IsZero() {
				conds = append(conds, id+" >= "+arg(uuidAt(w.Since)))
			}
			if !w.Until.IsZero() {
				conds = append(conds, id+" < "+arg(uuidAt(w.Until)))
			}
		}
	}
	if w.AggregateType != "" {
		conds = append(conds, pgx.Identifier{t.layout.Columns.AggregateType}.Sanitize()+" = "+arg(w.AggregateType))
	}
	if w.IDs != nil {
		if t.idIsUUID {
			for _, x := range w.IDs {
				if _, ok := parseUUID(x); !ok {
					return "", nil, fmt.Errorf("id %q is not a UUID (the id column %s is uuid)", x, t.layout.Columns.ID)
				}
			}
			conds = append(conds, id+" = ANY("+arg(w.IDs)+"::uuid[])")
		} else {
			conds = append(conds, id+"::text = ANY("+arg(w.IDs)+"::text[])")
		}
	}
	if !w.timed() && w.IDs == nil && !w.All {
		return "", nil, errors.New("say which rows: --since (and --until), --ids FILE, or --all")
	}
	if w.Sent {
		conds = append(conds, sentSQL)
	}
	if w.extra != "" {
		conds = append(conds, w.extra)
	}
	if len(conds) == 0 {
		return "true", nil, nil
	}
	return strings.Join(conds, " AND "), args, nil
}

// sentSQL is the condition of a row of the poll source that its poller
// considers sent (Window.Sent).
const sentSQL = "status IN ('SENT', 'DEAD')"

// Unsent counts the rows of w (Sent or not) that the poll source has not
// sent yet: PENDING, SENDING or PARKED.
func (t *Table) Unsent(ctx context.Context, w Window) (int, error) {
	w.Sent = false
	cond, args, err := t.where(ctx, w)
	if err != nil {
		return 0, err
	}
	var n int
	if err := t.conn.QueryRow(ctx, "SELECT count(*) FROM "+t.name+" WHERE "+cond+" AND NOT "+sentSQL, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the window's unsent rows: %w", err)
	}
	return n, nil
}

// parseUUID checks the text form of a UUID.
func parseUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return "", false
			}
		}
	}
	return strings.ToLower(s), true
}
