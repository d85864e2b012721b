package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
)

// ProtocolError is a replication stream that walrelay cannot read: a
// message of a type or shape the protocol does not have there, or a message
// larger than postgres.max_message_bytes that is not WAL data. The session
// ends, and the next one starts from the confirmed position (it is
// retriable): a broken proxy or server must not stop walrelay for good, nor
// make it allocate what the server claims.
type ProtocolError struct {
	Err error
}

func (e *ProtocolError) Error() string { return "replication protocol: " + e.Err.Error() }

func (e *ProtocolError) Unwrap() error { return e.Err }

// ErrServerEndedStream is wrapped when the server ended the replication
// stream on its side, as a walsender does when the server shuts down or
// restarts: the session ends, and the next one starts from the confirmed
// position (it is retriable), as after a lost connection.
var ErrServerEndedStream = errors.New("the server ended the replication stream: PostgreSQL is shutting down or restarting, or the walsender was stopped")

// Cut is a value left out of a message too large to hold (Change.Cuts).
type Cut struct {
	// Column is the index of the value in an insert's tuple; for a logical
	// decoding message, 0: its content.
	Column int
	// Size is the value's size in bytes; -1 when unknown (the content of a
	// message whose prefix was too long to keep).
	Size int64
}

// oversized is what the frameReader learnt of an XLogData too large to
// hold, delivered in its place as a stand-in (tooLargeTag).
type oversized struct {
	walStart, walEnd pglogrepl.LSN
	size             int64  // bytes of the pgoutput message
	head             []byte // the message cut down
	cuts             []Cut
}

// tooLargeTag is the one byte of the CopyData that the frameReader puts in
// place of an XLogData too large to hold. The server never sends a CopyData
// that starts with it (XLogData is 'w', a keepalive 'k'), and nothing in
// the WAL can make it: the type byte is the walsender's, not the data's. A
// stand-in the frameReader did not make (a hostile server) finds no facts
// waiting and is a ProtocolError.
const tooLargeTag = 0

// xlogHeader is the size of an XLogData's header: 'w', WALStart,
// ServerWALEnd, ServerTime.
const xlogHeader = 1 + 8 + 8 + 8

// headBudget is the most a cut-down message keeps: the values that fit are
// kept (an outbox row's id, routing, key and type), a logical message's
// content up to it (where its id and key are, in the order walrelay_emit
// writes them).
const headBudget = 64 << 10

// frameReader is the reader under pgproto3's Frontend on a replication
// connection (pgconn.Config.BuildFrontend). It follows the framing of the
// server's messages (a type byte and a length) without copying: a message up
// to its limit passes through untouched, in the buffer its reader gave. A
// CopyData over the limit is never held: its XLogData header and the head of
// its pgoutput message are parsed as they arrive (cut, the rest read from
// the socket into a small buffer and dropped), and a CopyData of one byte,
// tooLargeTag, takes its place in the stream, the facts waiting in pending
// for the session. Any other message over the limit is a ProtocolError,
// before anything of it is allocated. It adds no allocation per message.
//
// pgconn reads on after a read deadline passed (a timeout is not an error
// of the stream), so every state survives an error of the reader under it.
type frameReader struct {
	src   io.Reader
	limit int64 // the largest message body that passes; of a CopyData, the largest pgoutput message

	skip int64   // bytes of the message passing through still to come
	hdr  [5]byte // a message header seen and held back until it is whole
	nhdr int
	out  [6]byte // bytes to give before reading on: a held header, a stand-in
	outN int
	outI int
	err  error // a refusal: given once the bytes before it are

	big     *cutter // the oversized message being read, nil when none
	scratch []byte  // where an oversized message's bytes are dropped
	pending []oversized

	received atomic.Int64 // bytes read from the server
}

func newFrameReader(src io.Reader, limit int64) *frameReader {
	return &frameReader{src: src, limit: limit}
}

// Read gives the server's messages, each over the limit replaced.
func (f *frameReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if f.outI < f.outN {
			n := copy(p, f.out[f.outI:f.outN])
			f.outI += n
			return n, nil
		}
		if f.err != nil {
			return 0, f.err
		}
		if f.big != nil {
			if err := f.drop(); err != nil {
				return 0, err
			}
			continue
		}
		if f.nhdr > 0 {
			// A header cut by the last read: it is whole before any of it
			// is given, since it may have to be replaced.
			n, err := f.src.Read(f.hdr[f.nhdr:])
			f.received.Add(int64(n))
			if f.nhdr += n; f.nhdr < len(f.hdr) {
				if err != nil {
					return 0, err
				}
				continue
			}
			f.nhdr = 0
			if f.frame(f.hdr[:]) == framePass {
				f.outN, f.outI = copy(f.out[:], f.hdr[:]), 0
			}
			continue
		}
		n, err := f.src.Read(p)
		f.received.Add(int64(n))
		give := f.scan(p[:n])
		if give > 0 || err != nil {
			return give, err
		}
	}
}

// Verdicts of frame.
const (
	framePass   = iota // the message passes
	frameCut           // an XLogData over the limit: big reads it
	frameRefuse        // refused: err
)

// frame reads a message header: a message up to the limit passes (skip is
// set to its body); an XLogData over it is cut (big); another is refused
// (err).
func (f *frameReader) frame(h []byte) int {
	typ, length := h[0], binary.BigEndian.Uint32(h[1:5])
	if length < 4 {
		f.err = &ProtocolError{Err: fmt.Errorf("message %q of length %d: the length counts itself, at least 4", typ, length)}
		return frameRefuse
	}
	body := int64(length) - 4
	// The limit is the pgoutput message's (postgres.max_message_bytes: the
	// largest event held), so a CopyData carries an XLogData header more:
	// cut at the limit alone, a message up to xlogHeader bytes under it
	// was cut, and said to be over it at a size that was not.
	limit := f.limit
	if typ == 'd' {
		limit += xlogHeader
	}
	if body <= limit {
		f.skip = body
		return framePass
	}
	if typ != 'd' {
		f.err = &ProtocolError{Err: fmt.Errorf("message %q of %d bytes: over postgres.max_message_bytes (%d), and not WAL data", typ, body, f.limit)}
		return frameRefuse
	}
	if f.scratch == nil {
		f.scratch = make([]byte, 32<<10)
	}
	f.big = newCutter(body, int(min(headBudget, f.limit)))
	return frameCut
}

// scan follows the framing through b, which was just read, and returns how
// many of its bytes may be given: all, unless a header is cut at its end
// (held back in hdr), a message is refused, or an oversized message goes on
// after b. An oversized message wholly in b is replaced in b by its
// stand-in, and what follows it moved up.
func (f *frameReader) scan(b []byte) int {
	i := 0
	for i < len(b) {
		if f.skip > 0 {
			if rest := int64(len(b) - i); f.skip >= rest {
				f.skip -= rest
				return len(b)
			}
			i += int(f.skip)
			f.skip = 0
			continue
		}
		if len(b)-i < len(f.hdr) {
			f.nhdr = copy(f.hdr[:], b[i:])
			return i
		}
		switch f.frame(b[i : i+len(f.hdr)]) {
		case framePass:
			i += len(f.hdr)
			continue
		case frameRefuse:
			return i
		}
		c, rest := f.big, b[i+len(f.hdr):]
		if c.left > int64(len(rest)) {
			c.feed(rest)
			if c.err != nil {
				f.err, f.big = c.err, nil
			}
			return i
		}
		f.big = nil
		c.feed(rest[:c.left])
		if c.err != nil {
			f.err = c.err
			return i
		}
		rest = rest[c.size:]
		o, err := c.result()
		if err != nil {
			f.err = err
			return i
		}
		f.pending = append(f.pending, o)
		n := copy(b[i:], standIn[:])
		n += copy(b[i+n:], rest)
		b = b[:i+n]
		i += len(standIn)
	}
	return len(b)
}

// standIn is the CopyData that takes the place of an oversized XLogData.
var standIn = [6]byte{'d', 0, 0, 0, 5, tooLargeTag}

// drop reads the rest of the oversized message and puts its stand-in in
// out.
func (f *frameReader) drop() error {
	c := f.big
	for c.left > 0 && c.err == nil {
		n, err := f.src.Read(f.scratch[:min(int64(len(f.scratch)), c.left)])
		f.received.Add(int64(n))
		c.feed(f.scratch[:n])
		if err != nil && c.left > 0 {
			return err
		}
	}
	f.big = nil
	o, err := c.result()
	if c.err != nil {
		err = c.err
	}
	if err != nil {
		f.err = err
		return err
	}
	f.pending = append(f.pending, o)
	f.out, f.outN, f.outI = standIn, len(standIn), 0
	return nil
}

// take returns the facts of the oldest stand-in given.
func (f *frameReader) take() (oversized, bool) {
	if len(f.pending) == 0 {
		return oversized{}, false
	}
	o := f.pending[0]
	f.pending = f.pending[1:]
	return o, true
}

// Cutter states.
const (
	cutXLog   = iota // the XLogData header
	cutType          // the pgoutput message type
	cutFixed         // a fixed part: need bytes into acc, then next
	cutPrefix        // a logical message's prefix, to its NUL
	cutKeep          // bytes kept: a value, a message's content or first bytes
	cutSkip          // a value left out
	cutKind          // a tuple value's kind
	cutRest          // the rest, dropped
)

// cutter reads an oversized XLogData as it arrives and keeps its head: the
// XLogData header, and the pgoutput message cut down to about budget bytes.
// An insert keeps its structure, each value that does not fit given as NULL
// ('n') and listed in cuts; a logical message keeps its prefix and the start
// of its content (its length field rewritten); any other message keeps its
// first bytes. It allocates nothing per byte.
type cutter struct {
	left   int64 // body bytes still to come
	size   int64 // the CopyData body's size
	budget int
	xlog   [xlogHeader]byte
	nxlog  int
	head   []byte
	cuts   []Cut
	err    error

	state int
	need  int64   // bytes still to read in this state
	acc   [9]byte // a fixed part being read
	nacc  int
	next  func() // what follows the fixed part
	kind  byte   // the kind of the value being read
	cols  int    // values in the tuple
	col   int    // the value being read
}

func newCutter(body int64, budget int) *cutter {
	return &cutter{left: body, size: body, budget: budget, head: make([]byte, 0, budget)}
}

// fixed reads n bytes into acc, then calls next.
func (c *cutter) fixed(n int, next func()) {
	c.state, c.need, c.nacc, c.next = cutFixed, int64(n), 0, next
}

// room says whether n more bytes fit in the head.
func (c *cutter) room(n int64) bool { return int64(len(c.head))+n <= int64(c.budget) }

// feed reads b, the next bytes of the message.
func (c *cutter) feed(b []byte) {
	c.left -= int64(len(b))
	for len(b) > 0 && c.err == nil {
		switch c.state {
		case cutXLog:
			n := copy(c.xlog[c.nxlog:], b)
			c.nxlog += n
			b = b[n:]
			if c.xlog[0] != pglogrepl.XLogDataByteID {
				c.err = &ProtocolError{Err: fmt.Errorf("CopyData %q of %d bytes: over postgres.max_message_bytes, and not XLogData", c.xlog[0], c.size)}
				return
			}
			if c.nxlog == len(c.xlog) {
				c.state = cutType
			}
		case cutType:
			t := b[0]
			b = b[1:]
			c.head = append(c.head, t)
			switch t {
			case 'I':
				c.fixed(7, c.insertHead) // relation id, 'N', column count
			case 'M':
				c.fixed(9, c.messageHead) // flags, LSN
			default:
				c.state, c.need = cutKeep, int64(c.budget-1) // its first bytes
			}
		case cutFixed:
			n := copy(c.acc[c.nacc:c.need], b)
			c.nacc += n
			b = b[n:]
			if int64(c.nacc) == c.need {
				c.next()
			}
		case cutPrefix:
			i := 0
			for i < len(b) && b[i] != 0 {
				i++
			}
			if !c.room(int64(i) + 1 + 4) {
				// A prefix too long to keep (no configured prefix is this
				// long): kept cut, with no content.
				c.head = append(c.head, b[:max(c.budget-len(c.head)-5, 0)]...)
				c.head = append(c.head, 0, 0, 0, 0, 0)
				c.cuts = append(c.cuts, Cut{Column: 0, Size: -1})
				c.state = cutRest
				continue
			}
			c.head = append(c.head, b[:i]...)
			b = b[i:]
			if len(b) > 0 {
				c.head = append(c.head, 0)
				b = b[1:]
				c.fixed(4, c.contentLength)
			}
		case cutKeep, cutSkip:
			n := min(int64(len(b)), c.need)
			if c.state == cutKeep {
				c.head = append(c.head, b[:n]...)
			}
			b = b[n:]
			if c.need -= n; c.need == 0 {
				c.nextValue()
			}
		case cutKind:
			c.kind = b[0]
			b = b[1:]
			switch c.kind {
			case 't', 'b':
				c.fixed(4, c.valueLength)
			case 'n', 'u':
				c.head = append(c.head, c.kind)
				c.nextValue()
			default:
				c.state = cutRest // malformed: the decoder refuses the head
			}
		case cutRest:
			return
		}
	}
}

// insertHead follows an insert's relation id, 'N' and column count.
func (c *cutter) insertHead() {
	c.head = append(c.head, c.acc[:7]...)
	if c.acc[4] != 'N' {
		c.state = cutRest
		return
	}
	c.cols, c.col = int(binary.BigEndian.Uint16(c.acc[5:7])), -1
	c.nextValue()
}

// nextValue moves to the next value of an insert's tuple; after the last
// one, or in another message, the rest is dropped.
func (c *cutter) nextValue() {
	if c.head[0] != 'I' {
		c.state = cutRest
		return
	}
	if c.col++; c.col >= c.cols {
		c.state = cutRest
		return
	}
	c.state = cutKind
}

// valueLength decides on a value once its length is read: kept if it fits,
// else given as NULL and listed in cuts.
func (c *cutter) valueLength() {
	l := int64(binary.BigEndian.Uint32(c.acc[:4]))
	if c.room(1 + 4 + l) {
		c.head = append(c.head, c.kind)
		c.head = append(c.head, c.acc[:4]...)
		c.state, c.need = cutKeep, l
	} else {
		c.head = append(c.head, 'n')
		c.cuts = append(c.cuts, Cut{Column: c.col, Size: l})
		c.state, c.need = cutSkip, l
	}
	if l == 0 {
		c.nextValue()
	}
}

// messageHead follows a logical message's flags and LSN.
func (c *cutter) messageHead() {
	c.head = append(c.head, c.acc[:9]...)
	c.state = cutPrefix
}

// contentLength keeps as much of a logical message's content as fits, and
// writes that length in place of the content's.
func (c *cutter) contentLength() {
	l := int64(binary.BigEndian.Uint32(c.acc[:4]))
	keep := min(l, max(int64(c.budget-len(c.head)-4), 0))
	c.head = binary.BigEndian.AppendUint32(c.head, uint32(keep))
	c.cuts = append(c.cuts, Cut{Column: 0, Size: l})
	c.state, c.need = cutKeep, keep
	if keep == 0 {
		c.state = cutRest
	}
}

// result returns what was learnt of the message, once it is read.
func (c *cutter) result() (oversized, error) {
	if c.nxlog < len(c.xlog) || len(c.head) == 0 {
		return oversized{}, &ProtocolError{Err: fmt.Errorf("XLogData of %d bytes: no message after its header", c.size)}
	}
	o := oversized{size: c.size - xlogHeader, head: c.head, cuts: c.cuts}
	o.walStart = pglogrepl.LSN(binary.BigEndian.Uint64(c.xlog[1:9]))
	o.walEnd = pglogrepl.LSN(binary.BigEndian.Uint64(c.xlog[9:17]))
	return o, nil
}

// errNoStandIn is a stand-in that the frameReader did not make.
var errNoStandIn = errors.New("a CopyData of one zero byte, which the server does not send")
