package decoder

import (
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/walrelay/walrelay/event"
)

// Column is a column of the outbox table as a query sees it: its name and
// type OID.
type Column struct {
	Name     string
	DataType uint32
}

// RowReader makes events of outbox rows read with SQL, each value in its
// text form (the type's output function, in a session with the replication
// session's settings: DateStyle=ISO, TimeZone=UTC, extra_float_digits=3,
// bytea_output=hex), exactly as the decoder makes them of the rows the WAL
// carries: for tools that read the table (replay, reconcile). Its events
// carry no WAL position. It is not safe for concurrent use.
type RowReader struct {
	d    *Decoder
	r    *relation
	vals []tupleValue
}

// NewRowReader returns a RowReader of the outbox table of l whose columns,
// in the order of the values given to Event, are cols. A required or header
// column missing from cols is an error.
func NewRowReader(l Layout, cols []Column) (*RowReader, error) {
	d, err := New(Config{Layout: l})
	if err != nil {
		return nil, err
	}
	rel := &pglogrepl.RelationMessage{RelationID: d.cfg.RelationID, Namespace: d.cfg.Schema, RelationName: d.cfg.Table}
	for _, c := range cols {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.Name, DataType: c.DataType})
	}
	if err := d.relation(rel); err != nil {
		return nil, err
	}
	return &RowReader{d: d, r: d.rels[rel.RelationID]}, nil
}

// Event makes the event of one row: vals[i] is the text of column i, nil
// for NULL. A row that breaks a rule of its own (a required column NULL)
// gives an event with Invalid set, as from the WAL.
func (rr *RowReader) Event(vals [][]byte) (*event.Event, error) {
	if len(vals) != len(rr.r.cols) {
		return nil, fmt.Errorf("a row of %d values for %d columns", len(vals), len(rr.r.cols))
	}
	rr.vals = rr.vals[:0]
	for _, v := range vals {
		if v == nil {
			rr.vals = append(rr.vals, tupleValue{kind: 'n'})
		} else {
			rr.vals = append(rr.vals, tupleValue{kind: 't', data: v})
		}
	}
	return rr.d.tupleEvent(rr.r, rr.vals, &event.Event{Source: rr.r.source, Transactional: true}), nil
}
