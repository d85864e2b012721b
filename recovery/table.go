package recovery

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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

// ErrNoTime refuses a time window on a table that cannot place its rows in
// time.
var ErrNoTime = errors.New("time windows need a created_at column (walrelay migrate adds it), outbox.timestamp_column or UUIDv7 ids")

// TimeColumn is the column the time windows read (the timestamp column,
// else created_at), or "" when they read the time of UUIDv7 ids.
func (t *Table) TimeColumn() string { return t.timeColumn }

// Timed reports whether the table can place its rows in time: time
// windows (--since, --until, --older-than) are then possible. A table
// with neither a time column nor only UUIDv7 ids is not.
func (t *Table) Timed(ctx context.Context) (bool, error) {
	if t.timeColumn != "" {
		return true, nil
	}
	v7, _, err := t.uuidV7(ctx)
	return v7, err
}

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

// checkUUIDv7 refuses a table whose ids are not all UUIDv7: the time of
// one that is not (a random UUIDv4) is not its row's, and a window by id
// would take or leave such a row whatever its age.
func (t *Table) checkUUIDv7(ctx context.Context) error {
	noColumn, fix := "the table has no created_at", "run walrelay migrate (it adds created_at, the time of each insert; rows already there are of unknown time, older than any window, but UUIDv7 ids), set outbox.timestamp_column, or use --ids FILE or --all"
	if t.createdAtType != "" {
		noColumn = "its created_at is " + t.createdAtType + ", not timestamptz"
		fix = "set outbox.timestamp_column: created_at if it holds each row's time (without a zone, UTC), or use --ids FILE or --all"
	}
	if !t.idIsUUID {
		return fmt.Errorf("%w: the id column %s of %s is not uuid and %s; %s", ErrNoTime, t.layout.Columns.ID, t.Name(), noColumn, fix)
	}
	v7, sample, err := t.uuidV7(ctx)
	if err != nil {
		return err
	}
	if !v7 {
		return fmt.Errorf("%w: the ids of %s are not all UUIDv7 (%s is not) and %s; %s", ErrNoTime, t.Name(), sample, noColumn, fix)
	}
	return nil
}

// v7Pattern matches the text of a UUIDv7 (version 7, RFC 9562 variant).
const v7Pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"

// uuidV7 tells whether every id of the table is a UUIDv7 (an empty
// table's are), reading the whole table once, and returns an id that is
// not.
func (t *Table) uuidV7(ctx context.Context) (bool, string, error) {
	if !t.idIsUUID {
		return false, "", nil
	}
	if t.v7 != nil {
		return *t.v7, t.v7Sample, nil
	}
	var sample string
	err := t.conn.QueryRow(ctx, "SELECT "+pgx.Identifier{t.layout.Columns.ID}.Sanitize()+"::text FROM "+t.name+
		" WHERE "+pgx.Identifier{t.layout.Columns.ID}.Sanitize()+"::text !~ '"+v7Pattern+"' LIMIT 1").Scan(&sample)
	v7 := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !v7 {
		return false, "", fmt.Errorf("read the ids of %s: %w", t.Name(), err)
	}
	t.v7, t.v7Sample = &v7, sample
	return v7, sample, nil
}

// isV7 tells whether id is the text of a UUIDv7.
func isV7(id string) bool { return v7Regexp.MatchString(id) }

var v7Regexp = regexp.MustCompile(v7Pattern)

// Undated tells whether the table holds rows of unknown time that no
// window with a start selects: rows that were in it when walrelay migrate
// added created_at (migrations.CreatedAtUnknown) and whose ids are not
// UUIDv7. Such rows are reached by --all or --ids FILE only. It reads the
// created_at index's rows of that time.
func (t *Table) Undated(ctx context.Context) (bool, error) {
	if !t.unknownTimes {
		return false, nil
	}
	cond := migrations.UnknownTimeSQL(pgx.Identifier{t.timeColumn}.Sanitize())
	if t.idIsUUID {
		cond += " AND " + pgx.Identifier{t.layout.Columns.ID}.Sanitize() + "::text !~ '" + v7Pattern + "'"
	}
	var found bool
	if err := t.conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+t.name+" WHERE "+cond+")").Scan(&found); err != nil {
		return false, fmt.Errorf("read %s: %w", t.Name(), err)
	}
	return found, nil
}

// Row is one row of the window: its event (no WAL position, transaction
// or commit time: those headers of a replayed record are 0/0, 0 and the
// zero time) and the row's time, where known.
type Row struct {
	Event *event.Event
	Time  time.Time // zero if unknown
}

// Order is the order in which Rows reads a table: the order its rows were
// committed in, as far as the table can tell.
type Order struct {
	// By says what the order rests on, for the operator.
	By string
	// Unsure, if set, says why rows of one aggregate may still go out in
	// another order than they were committed in.
	Unsure string

	sql string // the ORDER BY list
}

// Order is the order of the table's rows that Rows reads them in. An
// order column is taken as it is; else the timestamp column or the time of
// UUIDv7 ids orders the transactions, and the command id and then the
// tuple's place order a transaction's rows (the order its statements ran
// and, within one statement, the order it inserted them in an outbox whose
// rows are never updated). A table with the poll source's columns has its
// rows updated by the poll source, which gives them the update's
// transaction id, command id and place: its created_at (the time of each
// row's insert), then the id, take their place. A table with none of these
// is ordered by transaction id, which is the order transactions first
// wrote, not always the order they committed.
func (t *Table) Order(ctx context.Context) (Order, error) {
	id := t.name + "." + pgx.Identifier{t.layout.Columns.ID}.Sanitize()
	// cid has no ordering operator; its text is its number.
	inTx, inTxBy := t.name+".cmin::text::int8, "+t.name+".ctid", "insert order"
	wrote, wroteBy := firstWrote(t.name+".xmin")+", "+inTx, "transaction id, then insert order"
	if t.polled {
		inTx = t.name + "." + pgx.Identifier{"created_at"}.Sanitize() + ", " + id
		inTxBy = "created_at (the poll source's insert order), then id"
		wrote, wroteBy = inTx, inTxBy
	}
	const updated = "a row updated after its insert goes out as of its update (the transaction id and place are the update's)"
	switch {
	case t.layout.OrderColumn != "":
		return Order{By: "outbox.order_column " + t.layout.OrderColumn, sql: t.name + "." + pgx.Identifier{t.layout.OrderColumn}.Sanitize() + ", " + id}, nil
	case t.tsColumn != "" && t.tsIsDate:
		unsure := "the timestamp column is a date: rows of one day go out in the order their transactions first wrote, not always the order they committed, " + updated + "; set outbox.order_column"
		if t.polled {
			unsure = "the timestamp column is a date: rows of one day go out in the order they were inserted (created_at), not always the order they committed; set outbox.order_column"
		}
		return Order{By: "outbox.timestamp_column " + t.tsColumn + ", then " + wroteBy, Unsure: unsure,
			sql: t.name + "." + pgx.Identifier{t.tsColumn}.Sanitize() + ", " + wrote}, nil
	case t.tsColumn != "":
		return Order{By: "outbox.timestamp_column " + t.tsColumn + ", then " + inTxBy, sql: t.name + "." + pgx.Identifier{t.tsColumn}.Sanitize() + ", " + inTx}, nil
	}
	v7, _, err := t.uuidV7(ctx)
	if err != nil {
		return Order{}, err
	}
	if v7 {
		// Ids of a monotonic generator (PostgreSQL 18's uuidv7(),
		// outbox.NewID) rise in the order they were made.
		return Order{By: "UUIDv7 ids", sql: id}, nil
	}
	if t.polled {
		return Order{By: wroteBy,
			Unsure: "created_at is the time of each row's insert: two transactions of an aggregate that committed in another order than they inserted go out in the order they inserted (the poll source's order), and rows that were in the table before walrelay migrate --poll share one created_at and go out in id order; set outbox.order_column",
			sql:    wrote}, nil
	}
	return Order{By: wroteBy,
		Unsure: "the table has no outbox.timestamp_column, outbox.order_column or UUIDv7 ids: transactions go out in the order they first wrote, not always the order they committed, rows written under a savepoint after their transaction's others, " + updated + ", and rows written more than 2^32 (4.3 billion) transactions ago, which PostgreSQL has frozen, in no reliable order; set outbox.order_column",
		sql:    wrote}, nil
}

// firstWrote is an ORDER BY key of rows by the transaction id xmin (an
// expression of type xid) that first wrote them, oldest first: by
// age(xmin), the transactions since. A row older than 2^31 transactions is
// frozen and keeps its xmin, whose age wraps to a negative number: 2^32 is
// added back (right up to 2^32 transactions; beyond, the xid tells nothing).
// A row frozen to the permanent xid 2 (by PostgreSQL before 9.4) is the
// oldest.
func firstWrote(xmin string) string {
	age := "age(" + xmin + ")"
	return "CASE WHEN " + xmin + "::text::int8 < 3 THEN 9223372036854775807 WHEN " + age + " < 0 THEN " + age + "::int8 + 4294967296 ELSE " + age + " END DESC"
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

// uuidAt is the smallest UUIDv7 of time tm: ids at or after it are of tm
// or later.
func uuidAt(tm time.Time) string {
	ms := tm.UnixMilli()
	return fmt.Sprintf("%08x-%04x-7000-8000-000000000000", uint64(ms)>>16, uint64(ms)&0xffff)
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
