package produce

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestExactlyOnceCloseFailsAPublishWaitingOnHeldRoom (review40): a
// push that waits for room because the open transaction holds the
// buffers, with nothing queued, is answered by close with ErrNotSent, as
// Close documents for later records; it is not left waiting for good
// (context.Background: nothing else ends its wait). On the queue itself:
// the sink commits a transaction that fills the buffers at once
// (package sink's TestExactlyOnceFullBuffersCommitAtOnce), and Close reaches a push
// waiting on it only in the window before that commit, when the flusher,
// finding the queue empty and closed, returns without ending the wait.
func TestExactlyOnceCloseFailsAPublishWaitingOnHeldRoom(t *testing.T) {
	t.Parallel()
	q := NewQueue(2, 1<<20, 1<<20)
	rec := func(i int) *kgo.Record {
		return &kgo.Record{Topic: "t", Key: []byte("k"), Value: []byte(fmt.Sprint(i))}
	}
	// The flusher takes two rounds of one record (the queue's half of
	// the buffers) in the open transaction, which then holds the buffers.
	for i := range 2 {
		q.Push(context.Background(), rec(i), false, nil, 0, func(*kgo.Record, error) {})
		if round, _, ok := q.Take(0, nil, time.Time{}, true); !ok || len(round) != 1 {
			t.Fatalf("take: %d records, ok %v, want 1", len(round), ok)
		}
	}
	third := make(chan error, 1)
	go q.Push(context.Background(), rec(2), false, nil, 0, func(_ *kgo.Record, err error) { third <- err })
	select {
	case err := <-third:
		t.Fatalf("the third push did not wait for the transaction's room: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	q.Close()
	select {
	case err := <-third:
		if !errors.Is(err, ErrNotSent) {
			t.Fatalf("the push waiting for room answered %v after close, want ErrNotSent", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the queue is closed and the push waiting for the open transaction's room (context.Background) is still blocked 3 s later: stranded for good")
	}
}
