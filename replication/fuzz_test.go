package replication

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walrelay/walrelay/internal/testkit/pgoutputtest"
)

// fakeServer returns the configuration of a replication connection to a
// server of the test's own, over a pipe: it answers the startup, the slot
// query, IDENTIFY_SYSTEM and START_REPLICATION as PostgreSQL does, then
// sends stream as it is, byte for byte, and closes the connection. What the
// client sends meanwhile (status updates) is read and dropped.
func fakeServer(tb testing.TB, stream []byte) *pgconn.Config {
	tb.Helper()
	return fakeServerWriting(tb, func(conn net.Conn) { _, _ = conn.Write(stream) })
}

// fakeServerWriting is fakeServer with the stream written by write.
func fakeServerWriting(tb testing.TB, write func(net.Conn)) *pgconn.Config {
	tb.Helper()
	cfg, err := pgconn.ParseConfig("host=fake.invalid user=walrelay database=shop sslmode=disable")
	if err != nil {
		tb.Fatal(err)
	}
	cfg.LookupFunc = func(context.Context, string) ([]string, error) { return []string{"192.0.2.1"}, nil }
	cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		go serve(server, write)
		return client, nil
	}
	return cfg
}

// serve is fakeServer's side of one connection.
func serve(conn net.Conn, write func(net.Conn)) {
	defer conn.Close()
	be := pgproto3.NewBackend(conn, conn)
	if _, err := be.ReceiveStartupMessage(); err != nil {
		return
	}
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: 2})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if be.Flush() != nil {
		return
	}
	rows := func(vals ...string) error {
		rd := &pgproto3.RowDescription{}
		row := &pgproto3.DataRow{}
		for _, v := range vals {
			rd.Fields = append(rd.Fields, pgproto3.FieldDescription{Name: []byte("c"), DataTypeOID: 25, DataTypeSize: -1})
			row.Values = append(row.Values, []byte(v))
		}
		be.Send(rd)
		be.Send(row)
		be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		return be.Flush()
	}
	for {
		msg, err := be.Receive()
		if err != nil {
			return
		}
		q, ok := msg.(*pgproto3.Query)
		if !ok {
			return
		}
		switch {
		case strings.HasPrefix(q.String, "SELECT active"):
			err = rows("f", "0", "0/100", "0/100", "reserved", "t", "shop", "shop")
		case strings.HasPrefix(q.String, "SELECT backend_start"):
			err = rows("2026-01-01 00:00:00+00")
		case q.String == "IDENTIFY_SYSTEM":
			err = rows("7000000000000000001", "1", "0/1000000", "shop")
		case strings.HasPrefix(q.String, "START_REPLICATION"):
			be.Send(&pgproto3.CopyBothResponse{})
			if be.Flush() != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, conn) }()
			write(conn)
			return
		default:
			return
		}
		if err != nil {
			return
		}
	}
}

// fuzzLimit is the MaxMessageBytes of the stream FuzzStream reads.
const fuzzLimit = 4096

// readStream opens a session on a fakeServer that sends stream and reads it
// to its end: it returns the changes and the error that ended it.
func readStream(tb testing.TB, stream []byte, limit int64) ([]Change, error) {
	tb.Helper()
	s, err := New(Config{ConnConfig: fakeServer(tb, stream), MaxMessageBytes: limit, StatusInterval: 100 * time.Millisecond, BackoffMin: time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := s.Open(ctx)
	if err != nil {
		tb.Fatalf("open a session on the fake server: %v", err)
	}
	var changes []Change
	for {
		ch, err := sess.Next(ctx)
		if err != nil {
			sess.Close(err)
			return changes, err
		}
		ch.Data = append([]byte(nil), ch.Data...)
		changes = append(changes, ch)
	}
}

// typedStreamError reports whether err, which ended a session, is one of the
// kinds a caller can tell apart: the server's error, a stream walrelay cannot
// read, or the connection's end.
func typedStreamError(err error) bool {
	var pe *ProtocolError
	var pgErr *pgconn.PgError
	return errors.As(err, &pe) || errors.As(err, &pgErr) || connectionError(err) || errors.Is(err, ErrServerEndedStream)
}

// streamSeeds are streams as a server sends them: real pgoutput messages
// captured from PostgreSQL (decoder/testdata/stream.hex) in XLogData, with
// keepalives, a message over the limit, and ways a stream breaks.
func streamSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	var real []byte
	b, err := os.ReadFile("../decoder/testdata/stream.hex")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		lsn, data, _ := strings.Cut(line, " ")
		at, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			tb.Fatal(err)
		}
		msg, err := hex.DecodeString(data)
		if err != nil {
			tb.Fatal(err)
		}
		real = append(real, xlogData(at, msg)...)
	}
	real = append(real, keepalive(0x2000000, true)...)
	pad := strings.Repeat("p", 3*fuzzLimit)
	big := xlogData(0x3000000, pgoutputtest.Insert(1, str("id"), str("order"), str("a"), str("T"), &pad))
	msg := xlogData(0x3000100, pgoutputtest.Logical(true, 0x3000100, "walrelay", `{"id":"x","payload":"`+pad+`"}`))
	return [][]byte{
		real,
		append(append(append([]byte{}, real...), big...), msg...),
		real[:len(real)/2],
		big[:fuzzLimit+100],
		{'d', 0x7f, 0xff, 0xff, 0xff, 'w'}, // a CopyData of 2 GiB, cut short
		{'E', 0x40, 0, 0, 0},               // an ErrorResponse of 1 GiB
		message('d', []byte{tooLargeTag}),  // a stand-in the reader did not make
		message('d', nil),                  // an empty CopyData
		message('d', []byte{'w', 1, 2}),    // a short XLogData
		message('d', []byte{'k', 1}),       // a short keepalive
		message('c', nil),                  // CopyDone
		message('Z', []byte{'I'}),          // ReadyForQuery, not in a copy stream
		message('E', []byte("SFATAL\x00C57P01\x00Mterminating connection\x00\x00")),
	}
}

// FuzzStream feeds arbitrary bytes to a replication session as the server's
// side of its connection, after a well-formed start: CopyData framing,
// keepalives, XLogData headers, message sizes, messages over the limit,
// other messages. The session must not panic, must not allocate what a
// length field claims (a few MiB at most, whatever the input), must end
// with a typed error (*ProtocolError, *pgconn.PgError, ErrServerEndedStream, or the connection's
// end), and must yield no message over its limit.
func FuzzStream(f *testing.F) {
	for _, seed := range streamSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		changes, err := readStream(t, stream, fuzzLimit)
		runtime.ReadMemStats(&after)
		if !typedStreamError(err) {
			t.Fatalf("the session ended with an error of type %T: %v", errors.Unwrap(err), err)
		}
		for _, ch := range changes {
			max := fuzzLimit
			if ch.Kind == TooLarge {
				max = headBudget + 1<<16 + 16
			}
			if len(ch.Data) > max {
				t.Fatalf("a change of kind %d with %d bytes, over %d", ch.Kind, len(ch.Data), max)
			}
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20+4*uint64(len(stream)) {
			t.Fatalf("reading %d bytes allocated %d bytes", len(stream), alloc)
		}
	})
}
