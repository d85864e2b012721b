package recovery

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/outbox"
)

// batchRows is how many rows a batch reads.
const batchRows = 1000

// Table reads the outbox table of a layout.
type Table struct {
	conn      *pgx.Conn
	layout    decoder.Layout
	tsColumn  string
	name      string // schema.table, quoted
	cols      []decoder.Column
	selectSQL string // SELECT of every column as text
	// maxPayload, if above 0, is the largest payload text Rows reads
	// (LimitPayload).
	maxPayload int64
	list       string // every column as text
	// padded are the columns of a blank-padded type (char(n), bpchar,
	// a domain over it), read as their output pads them (ColumnText).
	padded   map[string]bool
	idType   string // the id column's type, as format_type writes it
	rows     *decoder.RowReader
	idIsUUID bool
	tsIsDate bool
	polled   bool // it has the poll source's columns (migrations.PollColumns)
	// timeColumn is the column of the time windows: the timestamp
	// column, else the table's created_at (migrations.CreatedAt) when it
	// is a timestamptz, else none (the time of UUIDv7 ids).
	timeColumn string
	// unknownTimes: the time column is created_at, whose
	// migrations.CreatedAtUnknown marks rows of unknown time (the rows
	// there when migrate added it): older than any window, but a UUIDv7
	// id's, placed by its time.
	unknownTimes bool
	// createdAtType is the type of a created_at column that is not a
	// timestamptz (the windows do not read it), or "".
	createdAtType string
	// v7 caches uuidV7's answer: whether every id is a UUIDv7, and an id
	// that is not.
	v7       *bool
	v7Sample string
}

// Open describes the outbox table of layout on conn, whose session it pins
// to the replication session's text formats. The layout's timestamp
// column, if set, must be a timestamp or date column of the table, and its
// order column, if set, a column of it.
func Open(ctx context.Context, conn *pgx.Conn, layout decoder.Layout) (*Table, error) {
	layout = layout.WithDefaults()
	timestampColumn := layout.TimestampColumn
	t := &Table{conn: conn, layout: layout, tsColumn: timestampColumn, name: pgx.Identifier{layout.Schema, layout.Table}.Sanitize()}
	// jit off: the batches are small queries that a JIT compile would
	// dominate.
	if _, err := conn.Exec(ctx, "SET DateStyle = ISO; SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET bytea_output = hex; SET jit = off"); err != nil {
		return nil, fmt.Errorf("set the session's formats: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT attname, atttypid::int8, format_type(atttypid, atttypmod), attnotnull,
			coalesce((SELECT nullif(typbasetype, 0) FROM pg_type WHERE oid = atttypid), atttypid) = 'bpchar'::regtype
		FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, t.name)
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s.%s: %w", layout.Schema, layout.Table, err)
	}
	var texts []string
	tsType, orderFound := "", false
	types := map[string]string{}
	for rows.Next() {
		var name, typ string
		var oid int64
		var notNull, padded bool
		if err := rows.Scan(&name, &oid, &typ, &notNull, &padded); err != nil {
			return nil, err
		}
		if padded && name != layout.Columns.ID {
			// Not the id: the statements that find rows by id compare
			// it as text (id::text = ANY(...)), trimmed.
			if t.padded == nil {
				t.padded = map[string]bool{}
			}
			t.padded[name] = true
		}
		if name == layout.Columns.Payload {
			layout.PayloadNotNull = notNull // as the relay reads it at start
		}
		if name == layout.Columns.AggregateID {
			layout.AggregateIDNullable = !notNull // as the relay reads it at start
		}
		t.cols = append(t.cols, decoder.Column{Name: name, DataType: uint32(oid)})
		texts = append(texts, t.ColumnText("", name))
		if name == layout.Columns.ID {
			t.idIsUUID = typ == "uuid"
			t.idType = typ
		}
		if name == timestampColumn {
			tsType = typ
		}
		orderFound = orderFound || name == layout.OrderColumn
		types[name] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the columns of %s.%s: %w", layout.Schema, layout.Table, err)
	}
	if len(t.cols) == 0 {
		return nil, fmt.Errorf("table %s.%s does not exist", layout.Schema, layout.Table)
	}
	if timestampColumn != "" && !strings.HasPrefix(tsType, "timestamp") && tsType != "date" {
		if tsType == "" {
			return nil, fmt.Errorf("outbox.timestamp_column: table %s.%s has no column %q", layout.Schema, layout.Table, timestampColumn)
		}
		return nil, fmt.Errorf("outbox.timestamp_column: column %q of %s.%s is %s, not a timestamp", timestampColumn, layout.Schema, layout.Table, tsType)
	}
	t.tsIsDate = tsType == "date"
	t.timeColumn = timestampColumn
	if typ, ok := types[migrations.CreatedAt]; t.timeColumn == "" && typ == "timestamp with time zone" {
		t.timeColumn = migrations.CreatedAt
		t.unknownTimes = true
	} else if ok && typ != "timestamp with time zone" {
		t.createdAtType = typ
	}
	t.polled = types["created_at"] == "timestamp with time zone"
	for _, c := range migrations.PollColumns {
		_, ok := types[c.Name]
		t.polled = t.polled && ok
	}
	if layout.OrderColumn != "" && !orderFound {
		return nil, fmt.Errorf("outbox.order_column: table %s.%s has no column %q", layout.Schema, layout.Table, layout.OrderColumn)
	}
	if t.rows, err = decoder.NewRowReader(layout, t.cols); err != nil {
		return nil, err
	}
	t.list = strings.Join(texts, ", ")
	t.selectSQL = "SELECT " + t.list + " FROM " + t.name
	return t, nil
}

// LimitPayload makes Rows leave out the columns of a row whose columns,
// as text, are over n bytes together (none when n is 0): the server
// measures them and does not send them (but the id, aggregate type,
// aggregate id and type, each when at most maxNameText bytes), and the
// row's event is Invalid with event.ErrTooLarge, without a payload, the
// row's size in OmittedBytes, as the WAL source makes an event too large
// to hold. A command reading a window then never holds such a row
// (postgres.max_message_bytes), whichever column is large.
func (t *Table) LimitPayload(n int64) { t.maxPayload = n }

// maxNameText bounds each of the columns that name a row (id, aggregate
// type, aggregate id, type) that a row over the limit keeps.
const maxNameText = 1024

// SizeSQL is the SQL expression of a row's size: the sum of the lengths
// of texts, the SQL expressions of its columns' text.
func SizeSQL(texts []string) string {
	terms := make([]string, len(texts))
	for i, x := range texts {
		terms[i] = "coalesce(octet_length(" + x + "), 0)"
	}
	return strings.Join(terms, " + ")
}

// CappedList is the select list of texts, the SQL expressions of every
// column's text in SelectList's order, each given as NULL when size (an
// SQL expression) is over limit (another), but for the columns that name
// the row (id, aggregate type, aggregate id, type), kept when each is at
// most maxNameText bytes: one large row is never sent whole, whichever
// column is large, and its dead letter still names it.
func (t *Table) CappedList(texts []string, size, limit string) string {
	c := t.layout.Columns
	names := map[string]bool{c.ID: true, c.AggregateType: true, c.AggregateID: true, c.Type: true}
	items := make([]string, len(texts))
	for i, x := range texts {
		if names[t.cols[i].Name] {
			items[i] = fmt.Sprintf("CASE WHEN (%s) > %s AND octet_length(%s) > %d THEN NULL ELSE %s END", size, limit, x, maxNameText, x)
		} else {
			items[i] = fmt.Sprintf("CASE WHEN (%s) > %s THEN NULL ELSE %s END", size, limit, x)
		}
	}
	return strings.Join(items, ", ")
}

// TooLargeError is the Invalid error of a row of size bytes (its columns'
// text) left out for being over limit (postgres.max_message_bytes).
func TooLargeError(size, limit int64) error {
	return fmt.Errorf("%w: the row's columns are %d bytes as text, over postgres.max_message_bytes (%d); they were not read", event.ErrTooLarge, size, limit)
}

// Layout is the table's layout, its payload's nullability read.
func (t *Table) Layout() decoder.Layout { return t.layout }

// SelectList is every column of the table as text, in the order Event
// reads them: for a query of the caller's own.
func (t *Table) SelectList() string { return t.list }

// SelectTexts is SelectList's columns each qualified with qual (a table
// name or alias; none if empty): for a query of the caller's own that
// reads them from a table aliased so.
func (t *Table) SelectTexts(qual string) []string {
	out := make([]string, len(t.cols))
	for i, c := range t.cols {
		out[i] = t.ColumnText(qual, c.Name)
	}
	return out
}

// ColumnText is the SQL expression of column name's text, qualified with
// qual (none if empty), as pgoutput sends it: a char(n) column (or a
// domain over one) as bpchar's output writes it, padded with blanks to n
// ("ab      "), as Debezium reads it too; its cast to text would drop the
// trailing blanks, so the same row would have another aggregate id (key)
// or type by source. The id column is read as text either way (the
// statements that find rows by id compare it so).
func (t *Table) ColumnText(qual, name string) string {
	col := pgx.Identifier{name}.Sanitize()
	if qual != "" {
		col = qual + "." + col
	}
	if t.padded[name] {
		return "bpcharout(" + col + ")::text"
	}
	return col + "::text"
}

// ColumnType is the type OID of the table's column name, 0 if it has none.
func (t *Table) ColumnType(name string) uint32 {
	for _, c := range t.cols {
		if c.Name == name {
			return c.DataType
		}
	}
	return 0
}

// IDType is the type of the id column (format_type's text).
func (t *Table) IDType() string { return t.idType }

// Event makes the event of one row's values, in SelectList's order.
func (t *Table) Event(vals [][]byte) (*event.Event, error) { return t.rows.Event(vals) }

// Name is the table's schema.table.
func (t *Table) Name() string { return t.layout.Schema + "." + t.layout.Table }

// Row is one row of the window: its event (no WAL position, transaction
// or commit time: those headers of a replayed record are 0/0, 0 and the
// zero time) and the row's time, where known.
type Row struct {
	Event *event.Event
	Time  time.Time // zero if unknown
}

// Rows calls fn for each row of the window in the table's Order, read by
// one query that the server sorts once. q, if set, runs the read (a
// transaction's snapshot).
func (t *Table) Rows(ctx context.Context, q pgx.Tx, w Window, fn func(Row) error) error {
	cond, args, err := t.where(ctx, w)
	if err != nil {
		return err
	}
	order, err := t.Order(ctx)
	if err != nil {
		return err
	}
	tsIndex := slices.IndexFunc(t.cols, func(c decoder.Column) bool { return c.Name == t.timeColumn })
	sql := t.selectSQL + " WHERE " + cond + " ORDER BY " + order.sql
	if t.maxPayload > 0 {
		// Every column's text made once per row (a lateral subquery that
		// OFFSET 0 keeps from being folded into each use), measured
		// together, and sent only when the row is under the limit (but
		// the short columns that name it).
		args = append(args, t.maxPayload)
		items := t.SelectTexts(t.name)
		texts := make([]string, len(items))
		as := make([]string, len(items))
		for i, it := range items {
			texts[i] = fmt.Sprintf("_wr_p._wr_%d", i)
			as[i] = it + " AS " + fmt.Sprintf("_wr_%d", i)
		}
		size := SizeSQL(texts)
		sql = "SELECT " + t.CappedList(texts, size, fmt.Sprintf("$%d::int8", len(args))) + ", (" + size + ")::text FROM " + t.name +
			" CROSS JOIN LATERAL (SELECT " + strings.Join(as, ", ") + " OFFSET 0) _wr_p WHERE " + cond + " ORDER BY " + order.sql
	}
	var rows pgx.Rows
	if q != nil {
		rows, err = q.Query(ctx, sql, args...)
	} else {
		rows, err = t.conn.Query(ctx, sql, args...)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", t.Name(), err)
	}
	defer rows.Close()
	for rows.Next() {
		raw := rows.RawValues()
		var size int64
		if t.maxPayload > 0 {
			size, _ = strconv.ParseInt(string(raw[len(raw)-1]), 10, 64)
			raw = raw[:len(raw)-1]
		}
		e, err := t.rows.Event(raw)
		if err != nil {
			return err
		}
		if t.maxPayload > 0 && size > t.maxPayload {
			e.Payload, e.OmittedBytes = nil, size
			e.Invalid = TooLargeError(size, t.maxPayload)
		}
		r := Row{Event: e}
		if tsIndex >= 0 && raw[tsIndex] != nil {
			if v, err := decoder.ParseText(t.cols[tsIndex].DataType, raw[tsIndex]); err == nil {
				if tm, ok := v.(time.Time); ok {
					r.Time = tm
				}
			}
			if t.unknownTimes && migrations.UnknownTime(r.Time) {
				r.Time = time.Time{} // unknown, but a UUIDv7's
				if tm, ok := outbox.IDTime(e.ID); ok && t.idIsUUID && isV7(e.ID) {
					r.Time = tm
				}
			}
		} else if tm, ok := outbox.IDTime(e.ID); ok && t.timeColumn == "" {
			r.Time = tm
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", t.Name(), err)
	}
	return nil
}
