package replication

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/pgoutputtest"
)

// TestSessionOversized reads streams with messages over MaxMessageBytes
// through a session: an XLogData over it is yielded as a TooLarge change
// with its position, size, cut-down head and cuts, between the messages
// around it; a stand-in that the frame reader did not make (a server that
// sends a CopyData of one zero byte) ends the session with a
// *ProtocolError; and a large message arriving more slowly than
// ReceiveTimeout is not taken for silence.
func TestSessionOversized(t *testing.T) {
	t.Parallel()
	const limit = 1024
	pad := strings.Repeat("p", 20000)
	big := pgoutputtest.Insert(1, str("id-1"), str("order"), str("a-1"), str("T"), &pad)
	cut := pgoutputtest.Insert(1, str("id-1"), str("order"), str("a-1"), str("T"), nil)
	small := pgoutputtest.Insert(1, str("id-2"), str("order"), str("a-2"), str("T"), str("{}"))
	stream := slices.Concat(xlogData(0x100, small), xlogData(0x200, big), keepalive(0x9000, false))

	check := func(t *testing.T, changes []Change) {
		t.Helper()
		if len(changes) != 3 || changes[0].Kind != Data || !bytes.Equal(changes[0].Data, small) || changes[2].Kind != Keepalive || changes[2].WALEnd != 0x9000 {
			t.Fatalf("changes %+v", changes)
		}
		tl := changes[1]
		if tl.Kind != TooLarge || tl.WALStart != 0x200 || tl.Size != int64(len(big)) || !bytes.Equal(tl.Data, cut) || !slices.Equal(tl.Cuts, []Cut{{Column: 4, Size: int64(len(pad))}}) {
			t.Fatalf("the oversized insert: %+v", tl)
		}
	}

	t.Run("yielded between its neighbours", func(t *testing.T) {
		t.Parallel()
		changes, err := readStream(t, stream, limit)
		if !connectionError(err) {
			t.Fatalf("ended with %v, want the connection's end", err)
		}
		check(t, changes)
	})

	t.Run("a stand-in the frame reader did not make", func(t *testing.T) {
		t.Parallel()
		changes, err := readStream(t, slices.Concat(xlogData(0x100, small), message('d', []byte{tooLargeTag})), limit)
		var pe *ProtocolError
		if len(changes) != 1 || !errors.As(err, &pe) || !errors.Is(err, errNoStandIn) {
			t.Fatalf("%d changes, then %v; want one, then a *ProtocolError", len(changes), err)
		}
	})

	t.Run("arriving more slowly than the receive timeout", func(t *testing.T) {
		t.Parallel()
		cfg := fakeServerWriting(t, func(conn net.Conn) {
			for b := stream; len(b) > 0; {
				n := min(len(b), 500)
				if _, err := conn.Write(b[:n]); err != nil {
					return
				}
				b = b[n:]
				time.Sleep(20 * time.Millisecond) // about 1 s in all
			}
		})
		s, err := New(Config{ConnConfig: cfg, MaxMessageBytes: limit, StatusInterval: 50 * time.Millisecond, ReceiveTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		sess, err := s.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var changes []Change
		for {
			ch, err := sess.Next(ctx)
			if err != nil {
				sess.Close(err)
				if !connectionError(err) {
					t.Fatalf("after %d changes: %v; want the connection's end after the stream", len(changes), err)
				}
				break
			}
			ch.Data = bytes.Clone(ch.Data)
			changes = append(changes, ch)
		}
		check(t, changes)
	})
}

// TestMessageLimitIsTheMessages (issue 48 item 2): MaxMessageBytes bounds
// the pgoutput message, as postgres.max_message_bytes says, not the
// CopyData around it: a message of exactly the limit passes whole, and one
// a byte over is yielded TooLarge with its true size, over the limit.
func TestMessageLimitIsTheMessages(t *testing.T) {
	t.Parallel()
	const limit = 1024
	insert := func(size int) []byte {
		pad := ""
		base := len(pgoutputtest.Insert(1, str("id-1"), str("order"), str("a-1"), str("T"), &pad))
		pad = strings.Repeat("p", size-base)
		return pgoutputtest.Insert(1, str("id-1"), str("order"), str("a-1"), str("T"), &pad)
	}
	at, over := insert(limit), insert(limit+1)
	changes, err := readStream(t, slices.Concat(xlogData(0x100, at), xlogData(0x200, over), keepalive(0x9000, false)), limit)
	if !connectionError(err) {
		t.Fatalf("ended with %v, want the connection's end", err)
	}
	if len(changes) != 3 {
		t.Fatalf("%d changes, want 3: %+v", len(changes), changes)
	}
	if ch := changes[0]; ch.Kind != Data || !bytes.Equal(ch.Data, at) {
		t.Fatalf("a message of %d bytes under a limit of %d: kind %v, size %d; want it whole", len(at), limit, ch.Kind, ch.Size)
	}
	if ch := changes[1]; ch.Kind != TooLarge || ch.Size != int64(len(over)) || ch.Size <= limit {
		t.Fatalf("a message of %d bytes over a limit of %d: kind %v, size %d; want TooLarge of its size", len(over), limit, ch.Kind, ch.Size)
	}
}
