package recovery

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/event"
	"github.com/walrelay/walrelay/internal/deadletter"
	"github.com/walrelay/walrelay/sink"
)

// Headers of dead-letter replays.
const (
	// HeaderReplayedFromDLQ marks a record that dlq replay sent: the
	// dead letter's topic/partition/offset.
	HeaderReplayedFromDLQ = "walrelay.replayed_from_dlq"
	// HeaderDLQReplayed marks, on the dead-letter topic, that the dead
	// letter at topic/partition/offset was replayed: a later dlq replay
	// skips it, and dlq list shows it as replayed.
	HeaderDLQReplayed = "walrelay.dlq_replayed"
)

// DeadLetter is one record of the dead-letter topic.
type DeadLetter struct {
	Partition     int32
	Offset        int64
	ID            string
	Reason        string
	Error         string
	OriginalTopic string // the topic it was meant for, if known
	Table         string // the outbox table of the event (schema.table; message for walrelay_emit)
	WALStart      string // the row's position in the WAL
	Time          time.Time
	Size          int  // the value's bytes
	Replayed      bool // a dlq replay sent it again
	Record        *kgo.Record
}

// Ref names the dead letter as its replay headers do.
func (d DeadLetter) Ref() string {
	return d.Record.Topic + "/" + strconv.Itoa(int(d.Partition)) + "/" + strconv.FormatInt(d.Offset, 10)
}

// ReadDLQ reads the dead-letter topic from since (its start when zero) to
// its end and calls fn for each dead letter, in partition and offset
// order within a partition; the replay markers are not dead letters, and
// mark those they name as Replayed. It reads the topic twice (the markers
// first), holding only the markers' references.
func ReadDLQ(ctx context.Context, opts []kgo.Opt, topic string, since time.Time, fn func(DeadLetter) error) error {
	replayed := map[string]bool{}
	err := readTopics(ctx, opts, []string{topic}, time.Time{}, func(r *kgo.Record) error {
		if ref := sink.Header(r, HeaderDLQReplayed); ref != "" {
			replayed[ref] = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	return readTopics(ctx, opts, []string{topic}, since, func(r *kgo.Record) error {
		if sink.Header(r, HeaderDLQReplayed) != "" {
			return nil
		}
		d := DeadLetter{Partition: r.Partition, Offset: r.Offset, ID: sink.Header(r, "id"), Reason: sink.Header(r, sink.HeaderReason),
			Error: sink.Header(r, sink.HeaderError), OriginalTopic: sink.Header(r, sink.HeaderTopic), Table: sink.Header(r, sink.HeaderSource), WALStart: sink.Header(r, sink.HeaderWALStart),
			Time: r.Timestamp, Size: len(r.Value), Record: r}
		d.Replayed = replayed[d.Ref()]
		return fn(d)
	})
}

// DLQReplayed is what a dlq replay did.
type DLQReplayed struct {
	Sent           int      // reached their topic
	FailedAgain    int      // dead-lettered again, with the new error
	Skipped        int      // replayed before
	NotReplayable  []string // ids, and why
	FromTable      int      // re-read from the outbox table
	FromDeadLetter int      // sent as the dead letter held it (the row is gone)
	// MarkedSent counts the rows of a table with the poll source's
	// columns that were DEAD and, replayed, are SENT now.
	MarkedSent int
}

// maxReplayHeld bounds the bytes of the dead letters (keys, values and
// headers) that ReplayDLQ holds at once: the command may run in walrelay's
// pod, under its memory limit. A variable for the tests.
var maxReplayHeld = 64 << 20

// ReplayDLQ republishes the dead letters that pick selects and no earlier
// replay sent: a row still in the outbox table is read again (a repaired
// NULL column is then fixed) and published through p as run would, with
// HeaderReplayedFromDLQ; a row that is gone goes to its original topic as
// the dead letter holds it (key, value and headers, walrelay's dead-letter
// headers removed). A dead letter that fails again is dead-lettered again
// with its new error. A row of a table with the poll source's columns that
// is DEAD and reached its topic is set SENT (claim_id "dlq-replay:" and the
// dead letter's reference). Each one replayed is then marked on the
// dead-letter topic (HeaderDLQReplayed), so that a second replay skips it.
// One whose id was cut (sink.HeaderIDOmitted: the id alone was over the
// dead-letter topic's cap) is not replayable: its prefix may name another
// row.
// One at a time: the dead-letter topic is small. The dead letters picked
// are held until sent: past maxReplayHeld bytes of them, nothing is sent
// and the error names the flags that pick fewer.
func ReplayDLQ(ctx context.Context, t *Table, p Publisher, opts []kgo.Opt, topic string, pick func(DeadLetter) bool, dry bool) (DLQReplayed, error) {
	var res DLQReplayed
	var todo []DeadLetter
	held := 0
	err := ReadDLQ(ctx, opts, topic, time.Time{}, func(d DeadLetter) error {
		if !pick(d) {
			return nil
		}
		if d.Replayed {
			res.Skipped++
			return nil
		}
		held += len(d.Record.Key) + len(d.Record.Value)
		for _, h := range d.Record.Headers {
			held += len(h.Key) + len(h.Value)
		}
		if held > maxReplayHeld {
			return fmt.Errorf("the dead letters picked (%d so far) hold over %d MiB of keys, values and headers, more than dlq replay holds at once: pick fewer with --reason or --id, and replay the rest after", len(todo)+1, maxReplayHeld>>20)
		}
		todo = append(todo, d)
		return nil
	})
	if err != nil {
		return res, err
	}
	if dry {
		res.Sent = len(todo)
		return res, nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...), kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return res, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	for _, d := range todo {
		from := event.Header{Key: HeaderReplayedFromDLQ, Value: []byte(d.Ref())}
		if cut := sink.Header(d.Record, sink.HeaderIDOmitted); cut != "" {
			// Its id is a prefix of the event's: the row it names, if
			// any, is another one, and sent as the dead letter holds it,
			// it would carry another id.
			res.NotReplayable = append(res.NotReplayable, fmt.Sprintf("%s: its id is cut, %s bytes left out (too large for the dead-letter topic)", deadletter.Clip(d.ID, 128), cut))
			continue
		}
		var e *event.Event
		if d.ID != "" {
			err := t.Rows(ctx, nil, Window{IDs: []string{d.ID}}, func(r Row) error { e = r.Event; return nil })
			if err != nil && !strings.Contains(err.Error(), "is not a UUID") {
				return res, err
			}
		}
		var deadAgain bool
		switch {
		case e != nil:
			res.FromTable++
			s := newSender(p, false)
			if err := s.send(ctx, e, from); err != nil {
				return res, err
			}
			sent, err := s.wait()
			if err != nil {
				return res, err
			}
			deadAgain = len(sent.DeadLettered) > 0
			if !deadAgain {
				n, err := t.markReplayed(ctx, d.ID, d.Ref())
				if err != nil {
					return res, err
				}
				res.MarkedSent += n
			}
		case d.Record.Value == nil && sink.Header(d.Record, sink.HeaderOmitted) != "" || d.OriginalTopic == "":
			res.NotReplayable = append(res.NotReplayable, fmt.Sprintf("%s: its row is gone from the table and the dead letter lacks its value or topic", d.ID))
			continue
		case sink.Header(d.Record, sink.HeaderKeyHeadersOmitted) != "":
			// Sent without them, it would go to another partition than
			// its aggregate's, or lack a header its consumers read.
			res.NotReplayable = append(res.NotReplayable, fmt.Sprintf("%s: its row is gone from the table and the dead letter lacks its key or headers (too large for the dead-letter topic)", d.ID))
			continue
		case forbidden(p, d.OriginalTopic) != nil:
			// A row chose this topic (walrelay's own, Kafka's internal, or
			// outside kafka.allowed_topics): the dead letter is not
			// produced there by hand either.
			res.NotReplayable = append(res.NotReplayable, fmt.Sprintf("%s: its row is gone from the table, and %v", d.ID, forbidden(p, d.OriginalTopic)))
			continue
		default:
			res.FromDeadLetter++
			r := &kgo.Record{Topic: d.OriginalTopic, Key: d.Record.Key, Value: d.Record.Value}
			for _, h := range d.Record.Headers {
				switch h.Key {
				case sink.HeaderError, sink.HeaderReason, sink.HeaderSource, sink.HeaderWALStart, sink.HeaderTopic, sink.HeaderOmitted:
				default:
					r.Headers = append(r.Headers, h)
				}
			}
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: from.Key, Value: from.Value})
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				// It stays where it is, with the new error beside it.
				again := &kgo.Record{Topic: topic, Key: d.Record.Key, Value: d.Record.Value}
				for _, h := range d.Record.Headers {
					if h.Key != sink.HeaderError {
						again.Headers = append(again.Headers, h)
					}
				}
				again.Headers = append(again.Headers, kgo.RecordHeader{Key: sink.HeaderError, Value: deadletter.Clip(err.Error(), deadletter.MaxText)})
				if err := cl.ProduceSync(ctx, again).FirstErr(); err != nil {
					return res, fmt.Errorf("dead-letter %s again after its replay failed: %w", d.ID, err)
				}
				deadAgain = true
			}
		}
		if deadAgain {
			res.FailedAgain++
		} else {
			res.Sent++
		}
		marker := &kgo.Record{Topic: topic, Partition: d.Partition, Headers: []kgo.RecordHeader{{Key: HeaderDLQReplayed, Value: []byte(d.Ref())}}}
		if err := cl.ProduceSync(ctx, marker).FirstErr(); err != nil {
			return res, fmt.Errorf("mark dead letter %s replayed: %w", d.Ref(), err)
		}
	}
	return res, nil
}

// markReplayed sets the row id of a table with the poll source's columns
// SENT, if it is DEAD: dlq replay sent it. Else it would stay DEAD,
// holding its aggregate under poll.on_dead block, sent again by poll
// retry, and never pruned. It returns how many rows it set (0 or 1).
func (t *Table) markReplayed(ctx context.Context, id, ref string) (int, error) {
	if !t.polled {
		return 0, nil
	}
	tag, err := t.conn.Exec(ctx, "UPDATE "+t.name+" SET status = 'SENT', sent_at = now(), lease_until = NULL, claim_id = $2 WHERE "+
		pgx.Identifier{t.layout.Columns.ID}.Sanitize()+" = $1::text::"+t.idType+" AND status = 'DEAD'", id, "dlq-replay:"+ref)
	if err != nil {
		return 0, fmt.Errorf("mark row %s of %s SENT after its replay: %w", id, t.Name(), err)
	}
	return int(tag.RowsAffected()), nil
}

// forbidden returns why no event may go to topic, if p (a *sink.Sink)
// says so: a dead letter replayed from its own value goes to the topic its
// header names, which its row chose.
func forbidden(p Publisher, topic string) error {
	if c, ok := p.(interface{ CheckTopic(string) error }); ok {
		return c.CheckTopic(topic)
	}
	return nil
}
