package recovery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/sink"
)

// HeaderReplay marks a record that replay sent: the time of the replay
// (RFC 3339).
const HeaderReplay = "walrelay.replay"

// Publisher is what the tools publish through: *sink.Sink, so that
// routing, keys, headers, size limits and dead letters are those of run.
type Publisher interface {
	Publish(ctx context.Context, e *event.Event, done sink.Done)
	Topic(e *event.Event) string
}

// maxInFlight bounds the events published and not yet answered.
const maxInFlight = 5000

// Sent counts what a replay sent (or, in a dry run, would send).
type Sent struct {
	Rows         int
	Topics       map[string]int // events per topic
	DeadLettered map[string]int // events dead-lettered, by reason
}

// sender publishes events with a bound on those in flight and collects
// the first failure.
type sender struct {
	p    Publisher
	at   []byte // the replay's time
	dry  bool
	slot chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	sent Sent
	err  error
}

func newSender(p Publisher, dry bool) *sender {
	return &sender{p: p, dry: dry, slot: make(chan struct{}, maxInFlight), at: []byte(time.Now().UTC().Format(time.RFC3339Nano)),
		sent: Sent{Topics: map[string]int{}, DeadLettered: map[string]int{}}}
}

// send publishes e with the replay header (or counts it in a dry run).
func (s *sender) send(ctx context.Context, e *event.Event, extra ...event.Header) error {
	s.mu.Lock()
	s.sent.Rows++
	err := s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.dry {
		s.mu.Lock()
		s.sent.Topics[s.p.Topic(e)]++
		s.mu.Unlock()
		return nil
	}
	e.Headers = append(append(e.Headers, event.Header{Key: HeaderReplay, Value: s.at}), extra...)
	select {
	case s.slot <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.wg.Add(1)
	s.p.Publish(ctx, e, func(d sink.Delivery, err error) {
		defer s.wg.Done()
		<-s.slot
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case err != nil:
			if s.err == nil {
				s.err = fmt.Errorf("publish event %s: %w", e.ID, err)
			}
		case d.DeadLetter != "":
			s.sent.DeadLettered[d.DeadLetter]++
		default:
			s.sent.Topics[d.Topic]++
		}
	})
	return nil
}

// wait waits for every answer and returns what was sent and the first
// failure.
func (s *sender) wait() (Sent, error) {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.err
}

// Replay republishes the rows of w through p with their original id, key,
// routing, value and headers, plus HeaderReplay; dry only counts them per
// topic. progress, if set, is called after every batch of rows. It
// returns once Kafka answered every event.
func Replay(ctx context.Context, t *Table, p Publisher, w Window, dry bool, progress func(rows int)) (Sent, error) {
	s := newSender(p, dry)
	err := t.Rows(ctx, nil, w, func(r Row) error {
		if err := s.send(ctx, r.Event); err != nil {
			return err
		}
		if progress != nil && s.sent.Rows%batchRows == 0 {
			progress(s.sent.Rows)
		}
		return nil
	})
	sent, serr := s.wait()
	if err == nil {
		err = serr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return sent, fmt.Errorf("replay: %w", err)
	}
	return sent, err
}
