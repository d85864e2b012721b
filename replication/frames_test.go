package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walrelay/walrelay/internal/testkit/pgoutputtest"
)

// message frames a backend message: its type, its length, its body.
func message(typ byte, body []byte) []byte {
	b := []byte{typ}
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)+4))
	return append(b, body...)
}

// xlogData frames a pgoutput message as the server sends it: a CopyData
// holding an XLogData.
func xlogData(start pglogrepl.LSN, msg []byte) []byte {
	b := []byte{'w'}
	b = binary.BigEndian.AppendUint64(b, uint64(start))
	b = binary.BigEndian.AppendUint64(b, uint64(start)+uint64(len(msg)))
	b = binary.BigEndian.AppendUint64(b, 0)
	return message('d', append(b, msg...))
}

// keepalive frames a primary keepalive message.
func keepalive(end pglogrepl.LSN, reply bool) []byte {
	b := []byte{'k'}
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	b = binary.BigEndian.AppendUint64(b, 0)
	if reply {
		return message('d', append(b, 1))
	}
	return message('d', append(b, 0))
}

func str(s string) *string { return &s }

// timeoutErr is a read deadline passing.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// chunks gives r's bytes in reads of random sizes, a read deadline passing
// before every other one.
type chunks struct {
	r       io.Reader
	rng     *rand.Rand
	timeout bool
	n       int
}

func (c *chunks) Read(p []byte) (int, error) {
	if c.n++; c.timeout && c.n%2 == 0 {
		return 0, timeoutErr{}
	}
	return c.r.Read(p[:1+c.rng.IntN(len(p))])
}

// received is what the frontend over a frameReader read: each CopyData's
// data (a stand-in as the facts it stands for), then the error that ended
// the stream.
type received struct {
	data  [][]byte
	facts []oversized
	err   error
}

func receiveAll(t *testing.T, r io.Reader, limit int64) received {
	t.Helper()
	f := newFrameReader(r, limit)
	fe := pgproto3.NewFrontend(f, io.Discard)
	var got received
	for {
		m, err := fe.Receive()
		var te timeoutErr
		if errors.As(err, &te) {
			continue
		}
		if err != nil {
			got.err = err
			return got
		}
		cd, ok := m.(*pgproto3.CopyData)
		if !ok {
			t.Fatalf("a %T", m)
		}
		if len(cd.Data) == 1 && cd.Data[0] == tooLargeTag {
			if o, ok := f.take(); ok {
				got.facts = append(got.facts, o)
				got.data = append(got.data, nil)
				continue
			}
		}
		got.data = append(got.data, bytes.Clone(cd.Data))
	}
}

// TestFrameReader reads streams through a frameReader, each whole, a byte
// at a time, and in reads of random sizes with read deadlines passing
// between them: messages up to the limit pass untouched, an XLogData over it
// becomes a stand-in whose facts are its position, size and cut-down head,
// and any other message over it is a *ProtocolError after the messages
// before it.
func TestFrameReader(t *testing.T) {
	t.Parallel()
	const limit = 1024
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	begin := pgoutputtest.Begin(0x100, at, 7)
	small := pgoutputtest.Insert(1, str("id-1"), str("order"), str("a-1"), str("T"), str(`{}`), str("acme"))
	bigPayload := `{"pad":"` + strings.Repeat("x", 5000) + `"}`
	big := pgoutputtest.Insert(1, str("id-2"), str("order"), str("a-2"), str("T"), &bigPayload, str("acme"))
	bigCut := pgoutputtest.Insert(1, str("id-2"), str("order"), str("a-2"), str("T"), nil, str("acme"))
	hugePayload := strings.Repeat("y", 40000) // more than the frontend's buffer: read on after the stand-in's header
	huge := pgoutputtest.Insert(1, str("id-3"), str("order"), str("a-3"), str("T"), &hugePayload, nil)
	hugeCut := pgoutputtest.Insert(1, str("id-3"), str("order"), str("a-3"), str("T"), nil, nil)
	content := `{"id":"id-4","aggregatetype":"order","aggregateid":"a-4","type":"T","payload":"` + strings.Repeat("z", 3000) + `"}`
	msg := pgoutputtest.Logical(true, 0x300, "walrelay", content)

	type fact struct {
		start pglogrepl.LSN
		size  int
		head  []byte
		cuts  []Cut
	}
	cases := []struct {
		name   string
		stream [][]byte
		want   [][]byte // CopyData data; nil: a stand-in
		facts  []fact
		err    string // a *ProtocolError containing it ends the stream
	}{
		{
			name:   "messages up to the limit pass untouched",
			stream: [][]byte{xlogData(0x100, begin), xlogData(0x110, small), keepalive(0x120, true)},
			want:   [][]byte{xlogData(0x100, begin)[5:], xlogData(0x110, small)[5:], keepalive(0x120, true)[5:]},
		},
		{
			name:   "an insert over the limit keeps its structure, the payload given as NULL",
			stream: [][]byte{xlogData(0x100, begin), xlogData(0x200, big), xlogData(0x210, small)},
			want:   [][]byte{xlogData(0x100, begin)[5:], nil, xlogData(0x210, small)[5:]},
			facts:  []fact{{0x200, len(big), bigCut, []Cut{{Column: 4, Size: int64(len(bigPayload))}}}},
		},
		{
			name:   "an insert larger than the frontend's buffer",
			stream: [][]byte{xlogData(0x200, huge), keepalive(0x9000, false)},
			want:   [][]byte{nil, keepalive(0x9000, false)[5:]},
			facts:  []fact{{0x200, len(huge), hugeCut, []Cut{{Column: 4, Size: int64(len(hugePayload))}}}},
		},
		{
			name:   "two in a row",
			stream: [][]byte{xlogData(0x200, big), xlogData(0x300, big)},
			want:   [][]byte{nil, nil},
			facts: []fact{{0x200, len(big), bigCut, []Cut{{Column: 4, Size: int64(len(bigPayload))}}},
				{0x300, len(big), bigCut, []Cut{{Column: 4, Size: int64(len(bigPayload))}}}},
		},
		{
			name:   "a logical message over the limit keeps its prefix and the start of its content",
			stream: [][]byte{xlogData(0x300, msg), xlogData(0x310, small)},
			want:   [][]byte{nil, xlogData(0x310, small)[5:]},
			facts:  []fact{{0x300, len(msg), pgoutputtest.Logical(true, 0x300, "walrelay", content[:limit-1-1-8-len("walrelay")-1-4]), []Cut{{Column: 0, Size: int64(len(content))}}}},
		},
		{
			name:   "another message over the limit is refused after those before it",
			stream: [][]byte{xlogData(0x100, begin), message('E', bytes.Repeat([]byte{'M'}, 2000))},
			want:   [][]byte{xlogData(0x100, begin)[5:]},
			err:    `message 'E' of 2000 bytes: over postgres.max_message_bytes (1024), and not WAL data`,
		},
		{
			name:   "a CopyData over the limit that is not XLogData is refused",
			stream: [][]byte{keepalive(0x100, false), message('d', append([]byte{'k'}, make([]byte, 3000)...))},
			want:   [][]byte{keepalive(0x100, false)[5:]},
			err:    `CopyData 'k' of 3001 bytes: over postgres.max_message_bytes, and not XLogData`,
		},
		{
			name:   "a length under 4 is refused",
			stream: [][]byte{keepalive(0x100, false), {'d', 0, 0, 0, 3}},
			want:   [][]byte{keepalive(0x100, false)[5:]},
			err:    "the length counts itself",
		},
		{
			name:   "a stand-in the reader did not make is a CopyData like another",
			stream: [][]byte{message('d', []byte{tooLargeTag})},
			want:   [][]byte{{tooLargeTag}},
		},
	}
	for _, tc := range cases {
		for _, mode := range []string{"whole", "bytes", "chunks"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				var r io.Reader = bytes.NewReader(bytes.Join(tc.stream, nil))
				switch mode {
				case "bytes":
					r = iotest.OneByteReader(r)
				case "chunks":
					r = &chunks{r: r, rng: rand.New(rand.NewPCG(1, 2)), timeout: true}
				}
				got := receiveAll(t, r, limit)
				if len(got.data) != len(tc.want) {
					t.Fatalf("%d messages, want %d (error %v)", len(got.data), len(tc.want), got.err)
				}
				for i := range tc.want {
					if !bytes.Equal(got.data[i], tc.want[i]) {
						t.Fatalf("message %d: %q, want %q", i, tail(got.data[i]), tail(tc.want[i]))
					}
				}
				if len(got.facts) != len(tc.facts) {
					t.Fatalf("%d stand-ins, want %d", len(got.facts), len(tc.facts))
				}
				for i, w := range tc.facts {
					g := got.facts[i]
					if g.walStart != w.start || g.size != int64(w.size) || !bytes.Equal(g.head, w.head) || !slices.Equal(g.cuts, w.cuts) {
						t.Fatalf("stand-in %d: at %s, %d bytes, head %q, cuts %v; want at %s, %d bytes, head %q, cuts %v", i, g.walStart, g.size, tail(g.head), g.cuts, w.start, w.size, tail(w.head), w.cuts)
					}
				}
				var pe *ProtocolError
				switch {
				case tc.err == "" && !errors.Is(got.err, io.ErrUnexpectedEOF):
					t.Fatalf("the stream ended with %v, want its end", got.err)
				case tc.err != "" && (!errors.As(got.err, &pe) || !strings.Contains(got.err.Error(), tc.err)):
					t.Fatalf("the stream ended with %v, want a *ProtocolError: %s", got.err, tc.err)
				}
			})
		}
	}
}

// tail shortens b for a failure message.
func tail(b []byte) []byte {
	if len(b) > 80 {
		return append(append([]byte{}, b[:40]...), b[len(b)-40:]...)
	}
	return b
}

// loop gives a stream over and over.
type loop struct {
	b []byte
	i int
}

func (l *loop) Read(p []byte) (int, error) {
	if l.i == len(l.b) {
		l.i = 0
	}
	n := copy(p, l.b[l.i:])
	l.i += n
	return n, nil
}

// BenchmarkFrameReader receives a stream of outbox inserts of about 300
// bytes, each in its XLogData, with a keepalive every 100: through
// pgproto3's frontend alone, as before the frameReader, and through the
// frameReader under it. One op is one message received.
func BenchmarkFrameReader(b *testing.B) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var stream []byte
	payload := `{"seq": 1, "pad": "` + strings.Repeat("x", 270) + `"}`
	for i := range 1000 {
		stream = append(stream, xlogData(pglogrepl.LSN(i*400), pgoutputtest.Insert(1, str("0b8c2a6e-5d36-4d43-9f53-6c0f3c7f1a11"), str("order"), str("agg-1"), str("OrderCreated"), &payload))...)
		if i%100 == 0 {
			stream = append(stream, keepalive(pglogrepl.LSN(i*400), false)...)
			stream = append(stream, xlogData(pglogrepl.LSN(i*400), pgoutputtest.Begin(pglogrepl.LSN(i*400), at, uint32(i)))...)
		}
	}
	for _, tc := range []struct {
		name  string
		frame bool
	}{{"pgproto3 alone", false}, {"through the frameReader", true}} {
		b.Run(tc.name, func(b *testing.B) {
			var r io.Reader = &loop{b: stream}
			if tc.frame {
				r = newFrameReader(r, DefaultMaxMessageBytes)
			}
			fe := pgproto3.NewFrontend(r, io.Discard)
			b.SetBytes(int64(len(stream)) / 1020)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fe.Receive(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
