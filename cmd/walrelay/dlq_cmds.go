package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/recovery"
	"github.com/walrelay/walrelay/sink"
)

// knownReasons are the reasons walrelay dead-letters an event for.
var knownReasons = []string{"invalid_event", "invalid_topic", sink.ReasonForbiddenTopic, "invalid_partition", "too_large", "invalid_record", "max_attempts", sink.ReasonMessageBeforePrivileges}

func checkReason(r string) error {
	if r == "" {
		return nil
	}
	for _, k := range knownReasons {
		if k == r {
			return nil
		}
	}
	return fmt.Errorf("--reason %q: unknown (reasons: %s)", r, strings.Join(knownReasons, ", "))
}

// idList is a repeatable --id.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(v string) error { *l = append(*l, v); return nil }

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"dlq: want list, show or replay"}
	}
	sub := args[0]
	c := newRecoveryCmd("dlq "+sub, stdout, stderr, false)
	since := c.fs.String("since", "", "TIME: dead letters from then on (list)")
	reason := c.fs.String("reason", "", "only dead letters of this reason")
	var ids idList
	c.fs.Var(&ids, "id", "replay this event id (repeatable)")
	all := c.fs.Bool("all", false, "replay every dead letter not replayed yet")
	maxArgs := 0
	if sub == "show" {
		maxArgs = 1
	}
	pos, err := c.parse(args[1:], maxArgs, true)
	if err != nil {
		return err
	}
	limitMemory(c.cfg)
	if err := checkReason(*reason); err != nil {
		return err
	}
	from, err := parseTime("--since", *since)
	if err != nil {
		return err
	}
	sc, err := config.SinkConfig(c.cfg, nil)
	if err != nil {
		return err
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(sc.Brokers...)}, sc.Opts...)
	topic := c.cfg.Kafka.DLQTopic
	type row struct {
		Topic         string `json:"topic"`
		Partition     int32  `json:"partition"`
		Offset        int64  `json:"offset"`
		ID            string `json:"id"`
		Reason        string `json:"reason"`
		Error         string `json:"error"`
		OriginalTopic string `json:"original_topic"`
		WALStart      string `json:"wal_start"`
		Time          string `json:"time"`
		Size          int    `json:"size"`
		Replayed      bool   `json:"replayed"`
	}
	toRow := func(d recovery.DeadLetter) row {
		return row{topic, d.Partition, d.Offset, d.ID, d.Reason, d.Error, d.OriginalTopic, d.WALStart, d.Time.UTC().Format(time.RFC3339), d.Size, d.Replayed}
	}
	switch sub {
	case "list", "show":
		if sub == "show" && len(pos) != 1 {
			return usageError{"dlq show: want an event id"}
		}
		var rows []row
		err := recovery.ReadDLQ(ctx, opts, topic, from, func(d recovery.DeadLetter) error {
			if (*reason == "" || d.Reason == *reason) && (sub == "list" || d.ID == pos[0]) {
				rows = append(rows, toRow(d))
			}
			return nil
		})
		if err != nil {
			return err
		}
		if sub == "show" && len(rows) == 0 {
			return fmt.Errorf("no dead letter of event %s on %s", pos[0], topic)
		}
		if *c.json {
			return c.printJSON(rows)
		}
		if sub == "show" {
			for _, r := range rows {
				fmt.Fprintf(c.out, "id:             %s\nreason:         %s\nerror:          %s\noriginal topic: %s\nwal start:      %s\ntime:           %s\nsize:           %d bytes\nat:             %s/%d/%d\nreplayed:       %v\n\n",
					r.ID, r.Reason, r.Error, r.OriginalTopic, r.WALStart, r.Time, r.Size, r.Topic, r.Partition, r.Offset, r.Replayed)
			}
			return nil
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tREASON\tORIGINAL TOPIC\tWAL START\tTIME\tSIZE\tREPLAYED\tERROR")
		for _, r := range rows {
			e := r.Error
			if len(e) > 80 {
				e = e[:77] + "..."
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%v\t%s\n", r.ID, r.Reason, r.OriginalTopic, r.WALStart, r.Time, r.Size, r.Replayed, e)
		}
		return tw.Flush()
	case "replay":
		if len(ids) == 0 && *reason == "" && !*all {
			return errors.New("dlq replay: give --id ID (repeatable), --reason R or --all")
		}
		conn, err := c.connect(ctx)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		t, err := c.openTable(ctx, conn)
		if err != nil {
			return err
		}
		several := len(c.cfg.OutboxConfig().Layouts()) > 1
		sk, _, err := c.sink(ctx)
		if err != nil {
			return err
		}
		defer sk.Close()
		want := map[string]bool{}
		for _, id := range ids {
			want[id] = true
		}
		res, err := recovery.ReplayDLQ(ctx, t, sk, opts, topic, func(d recovery.DeadLetter) bool {
			return (len(want) == 0 || want[d.ID]) && (*reason == "" || d.Reason == *reason) &&
				(!several || d.Table == t.Name() || d.Table == "message" || d.Table == "")
		}, !*c.yes)
		if err != nil {
			return err
		}
		if *c.json {
			return c.printJSON(map[string]any{"dry_run": !*c.yes, "sent": res.Sent, "failed_again": res.FailedAgain, "skipped_replayed_before": res.Skipped,
				"from_table": res.FromTable, "from_dead_letter": res.FromDeadLetter, "not_replayable": res.NotReplayable, "dead_rows_marked_sent": res.MarkedSent})
		}
		if !*c.yes {
			fmt.Fprintf(c.out, "would replay %d dead letters (%d replayed before, skipped; dry run: add --yes)\n", res.Sent, res.Skipped)
			return nil
		}
		fmt.Fprintf(c.out, "replayed %d dead letters: %d reached their topic (%d re-read from %s, %d as the dead letter held them), %d failed again and are dead-lettered with the new error; %d replayed before, skipped\n",
			res.Sent+res.FailedAgain, res.Sent, res.FromTable, t.Name(), res.FromDeadLetter, res.FailedAgain, res.Skipped)
		if res.MarkedSent > 0 {
			fmt.Fprintf(c.out, "%d DEAD rows of %s that reached their topic are SENT now\n", res.MarkedSent, t.Name())
		}
		for _, n := range res.NotReplayable {
			fmt.Fprintln(c.out, "not replayable: "+n)
		}
		return nil
	}
	return usageError{fmt.Sprintf("dlq %s: want list, show or replay", sub)}
}
