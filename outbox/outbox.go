package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/walrelay/walrelay/decoder"
)

// Event is one event to write: a row of the outbox table.
type Event struct {
	// ID is the event id. Empty: a new UUIDv7 (NewID). Set it to reuse the
	// id of an earlier attempt of the same business operation.
	ID string
	// AggregateType routes the event to its topic
	// (outbox.event.<aggregatetype> by default). Required.
	AggregateType string
	// AggregateID is the Kafka key: one aggregate's events keep their
	// order. Required.
	AggregateID string
	// Type is the event's type (the Kafka header "type"). Required.
	Type string
	// Payload is the Kafka value. It must be valid JSON unless
	// Config.RawPayload is set. Nil writes NULL: a tombstone.
	Payload []byte
	// Headers are values of the outbox's header columns
	// (Layout.HeaderColumns), by column name; walrelay copies each into a
	// Kafka header of that name. A name that is not a header column is
	// refused.
	Headers map[string]string
	// Version is the aggregate's version, written in the layout's
	// VersionColumn (outbox.version_column), which walrelay publishes as
	// the header walrelay.aggregate_version: the writer increments it in
	// the transaction that changes the aggregate. Unused without a
	// VersionColumn.
	Version int64
}

// Config configures a Writer. The zero value writes walrelay's default
// layout (public.outbox, Debezium's column names, jsonb payload).
type Config struct {
	// Layout names the outbox table, its columns and its header columns,
	// as walrelay's outbox.* settings (or an entry of outbox.tables) do;
	// empty fields take walrelay's defaults. Only Schema, Table, Columns,
	// HeaderColumns, VersionColumn (Event.Version) and TraceColumn are
	// used: with a TraceColumn, each row
	// records the span context current in the caller's context
	// (OpenTelemetry's), so that walrelay's spans and the consumer's
	// continue the caller's trace; NULL without one.
	Layout decoder.Layout
	// RawPayload is for a payload column of type text or bytea: the
	// payload is written as given, not checked as JSON.
	RawPayload bool
	// Delete deletes each row in the same transaction right after
	// inserting it: the table stays empty, and the WAL (which walrelay
	// reads) still carries the insert. Replay and reconcile then have no
	// rows to work from.
	Delete bool
}

// Writer writes events into an outbox table of one layout. It is safe for
// concurrent use.
type Writer struct {
	cfg     Config
	insert  string
	del     string
	headers map[string]int // header column -> its parameter's index
	trace   int            // the trace column's parameter's index, or 0: none
	version int            // the version column's parameter's index, or 0: none
	params  int            // the insert's parameters
	table   string
}

// New returns a Writer for cfg.
func New(cfg Config) (*Writer, error) {
	l := cfg.Layout.WithDefaults()
	cfg.Layout = l
	c := l.Columns
	table := pgx.Identifier{l.Schema, l.Table}.Sanitize()
	cols := []string{c.ID, c.AggregateType, c.AggregateID, c.Type, c.Payload}
	w := &Writer{cfg: cfg, headers: map[string]int{}, table: l.Schema + "." + l.Table}
	for _, h := range l.HeaderColumns {
		if h == "" {
			return nil, errors.New("outbox: an empty header column name")
		}
		if _, dup := w.headers[h]; dup {
			return nil, fmt.Errorf("outbox: header column %q is listed twice", h)
		}
		w.headers[h] = len(cols)
		cols = append(cols, h)
	}
	if l.TraceColumn != "" {
		w.trace = len(cols)
		cols = append(cols, l.TraceColumn)
	}
	if l.VersionColumn != "" {
		w.version = len(cols)
		cols = append(cols, l.VersionColumn)
	}
	w.params = len(cols)
	seen := map[string]bool{}
	quoted := make([]string, len(cols))
	params := make([]string, len(cols))
	for i, col := range cols {
		if seen[col] {
			return nil, fmt.Errorf("outbox: column %q is used twice in the layout", col)
		}
		seen[col] = true
		quoted[i] = pgx.Identifier{col}.Sanitize()
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	w.insert = fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", table, strings.Join(quoted, ", "), strings.Join(params, ", "))
	w.del = fmt.Sprintf("DELETE FROM %s WHERE %s = $1", table, pgx.Identifier{c.ID}.Sanitize())
	return w, nil
}

// args checks e and returns its id and the insert's arguments; the trace
// column's is ctx's span context.
func (w *Writer) args(ctx context.Context, e *Event) (string, []any, error) {
	var missing []string
	for _, f := range []struct{ name, v string }{{"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID}, {"Type", e.Type}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return "", nil, fmt.Errorf("outbox: event %s has no %s", e.describe(), strings.Join(missing, ", "))
	}
	if e.Payload != nil && !w.cfg.RawPayload && !json.Valid(e.Payload) {
		return "", nil, fmt.Errorf("outbox: event %s: the payload is not valid JSON (set Config.RawPayload for a text or bytea payload column)", e.describe())
	}
	n := w.params
	if w.trace > 0 {
		if v := traceValue(ctx); v != "" {
			args := make([]any, n)
			args[w.trace] = v
			return w.fill(e, args)
		}
	}
	return w.fill(e, make([]any, n))
}

// fill puts e's values in args.
func (w *Writer) fill(e *Event, args []any) (string, []any, error) {
	for name, v := range e.Headers {
		i, ok := w.headers[name]
		if !ok {
			return "", nil, fmt.Errorf("outbox: event %s: header %q has no column in %s (header columns: %s)", e.describe(), name, w.table, w.headerList())
		}
		args[i] = v
	}
	id := e.ID
	if id == "" {
		id = NewID()
	}
	var payload any // nil: NULL
	if e.Payload != nil {
		payload = e.Payload
	}
	args[0], args[1], args[2], args[3], args[4] = id, e.AggregateType, e.AggregateID, e.Type, payload
	if w.version > 0 {
		args[w.version] = e.Version
	}
	return id, args, nil
}

// describe names e in an error: its id if set, else its type and aggregate.
func (e *Event) describe() string {
	if e.ID != "" {
		return e.ID
	}
	return fmt.Sprintf("(type %q, aggregate %q %q)", e.Type, e.AggregateType, e.AggregateID)
}

func (w *Writer) headerList() string {
	if len(w.headers) == 0 {
		return "none"
	}
	names := make([]string, 0, len(w.headers))
	for h := range w.headers {
		names = append(names, h)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// Write inserts e into the outbox in tx and returns its id. The event is
// published if and only if tx commits.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, e Event) (string, error) {
	ids, err := w.WriteBatch(ctx, tx, []Event{e})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// WriteBatch inserts events into the outbox in tx in one round trip, in
// order, and returns their ids. Nothing is sent if any event is refused.
func (w *Writer) WriteBatch(ctx context.Context, tx pgx.Tx, events []Event) ([]string, error) {
	ids := make([]string, len(events))
	b := &pgx.Batch{}
	for i := range events {
		id, args, err := w.args(ctx, &events[i])
		if err != nil {
			return nil, err
		}
		ids[i] = id
		b.Queue(w.insert, args...)
		if w.cfg.Delete {
			b.Queue(w.del, id)
		}
	}
	if len(events) == 0 {
		return ids, nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("outbox: insert %d events into %s: %w", len(events), w.table, err)
	}
	return ids, nil
}

// WriteSQL inserts e into the outbox in tx (database/sql, with a
// PostgreSQL driver that takes $n parameters, such as pgx's stdlib) and
// returns its id.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, e Event) (string, error) {
	id, args, err := w.args(ctx, &e)
	if err != nil {
		return "", err
	}
	if _, err := tx.ExecContext(ctx, w.insert, args...); err != nil {
		return "", fmt.Errorf("outbox: insert event %s into %s: %w", id, w.table, err)
	}
	if w.cfg.Delete {
		if _, err := tx.ExecContext(ctx, w.del, id); err != nil {
			return "", fmt.Errorf("outbox: delete event %s from %s: %w", id, w.table, err)
		}
	}
	return id, nil
}

// std writes walrelay's default layout.
var std, _ = New(Config{})

// Write inserts e into walrelay's default outbox table (public.outbox) in
// tx and returns its id. Use a Writer (New) for another layout.
func Write(ctx context.Context, tx pgx.Tx, e Event) (string, error) { return std.Write(ctx, tx, e) }

// WriteBatch inserts events into the default outbox table in tx in one
// round trip and returns their ids.
func WriteBatch(ctx context.Context, tx pgx.Tx, events []Event) ([]string, error) {
	return std.WriteBatch(ctx, tx, events)
}

// WriteSQL inserts e into the default outbox table in a database/sql
// transaction and returns its id.
func WriteSQL(ctx context.Context, tx *sql.Tx, e Event) (string, error) {
	return std.WriteSQL(ctx, tx, e)
}

// traceValue is the trace column's value for ctx's span context: its W3C
// traceparent, or with a tracestate the java.util.Properties text of both
// (as Debezium's tracingspancontext column holds); "" without a valid one.
func traceValue(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	parent := fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
	if st := sc.TraceState().String(); st != "" {
		return "traceparent=" + parent + "\ntracestate=" + propertiesValue(st)
	}
	return parent
}

// propertiesValue escapes s as a java.util.Properties value that reads
// back as s. A W3C tracestate is printable ASCII without leading blanks,
// so that only its backslashes need escaping: otherwise they would be
// read as escapes ("\n" a newline, "\u0041" an A, a trailing one a line
// continuation).
func propertiesValue(s string) string {
	return strings.ReplaceAll(s, `\`, `\\`)
}
