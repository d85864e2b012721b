// Package pgoutputtest encodes pgoutput protocol version 1 messages as the
// server sends them
// (https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html),
// for tests that feed the decoder or the relay without a server.
package pgoutputtest

import (
	"encoding/binary"
	"time"

	"github.com/jackc/pglogrepl"
)

// Time is t in PostgreSQL's wire form: microseconds since 2000-01-01 UTC.
func Time(t time.Time) uint64 {
	return uint64(t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds())
}

// Begin encodes a Begin message.
func Begin(final pglogrepl.LSN, t time.Time, xid uint32) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, uint64(final))
	b = binary.BigEndian.AppendUint64(b, Time(t))
	return binary.BigEndian.AppendUint32(b, xid)
}

// Commit encodes a Commit message.
func Commit(commit, end pglogrepl.LSN, t time.Time) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, uint64(commit))
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	return binary.BigEndian.AppendUint64(b, Time(t))
}

// Col is a column of a Relation message.
type Col struct {
	Name string
	OID  uint32
}

// Relation encodes a Relation message; the first column is the key.
func Relation(id uint32, ns, name string, cols []Col) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(append(b, ns...), 0)
	b = append(append(b, name...), 0)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for i, c := range cols {
		flags := byte(0)
		if i == 0 {
			flags = 1
		}
		b = append(b, flags)
		b = append(append(b, c.Name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.OID)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

// Insert encodes an Insert message with values in text; a nil value is
// NULL.
func Insert(rel uint32, vals ...*string) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, rel)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		if v == nil {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(*v)))
		b = append(b, *v...)
	}
	return b
}

// Logical encodes a logical decoding message (pg_logical_emit_message).
func Logical(transactional bool, lsn pglogrepl.LSN, prefix, content string) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, uint64(lsn))
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}
