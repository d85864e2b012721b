package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/recovery"
	"github.com/walrelay/walrelay/sink"
)

// exitCode ends a command with a code of its own and no further message:
// reconcile's 2 when rows are missing (and were not replayed).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// parseTime reads TIME: RFC 3339, or a duration before now.
func parseTime(flagName, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s %q: want RFC 3339 (2026-12-03T04:00:00Z) or a duration before now (2h)", flagName, s)
}

// readIDs reads an --ids file: one id a line; blank lines and # comments
// are skipped.
func readIDs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--ids: %w", err)
	}
	defer f.Close()
	ids := []string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ids = append(ids, line)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("--ids %s: %w", path, err)
	}
	return ids, nil
}

// recoveryCmd is an operator command over the outbox table and Kafka.
type recoveryCmd struct {
	*adminCmd
	since, until, aggType, ids *string
	table                      *string
	all, yes                   *bool
}

func newRecoveryCmd(name string, stdout, stderr io.Writer, window bool) *recoveryCmd {
	c := &recoveryCmd{adminCmd: newAdminCmd(name, stderr, stdout)}
	fs := c.fs
	c.yes = fs.Bool("yes", false, "really write (without it, only say what would be done)")
	c.table = fs.String("table", "", "the outbox table, schema.table: required when outbox.tables lists several")
	if window {
		c.since = fs.String("since", "", "TIME: the window's start, RFC 3339 or a duration before now (2h)")
		c.until = fs.String("until", "", "TIME: the window's end (default: now)")
		c.aggType = fs.String("aggregate-type", "", "only rows of this aggregate type")
		c.ids = fs.String("ids", "", "a file of ids, one a line: only these rows")
		c.all = fs.Bool("all", false, "the whole table")
	}
	return c
}

// window builds the window of the flags.
func (c *recoveryCmd) window() (recovery.Window, error) {
	var w recovery.Window
	var err error
	if w.Since, err = parseTime("--since", *c.since); err != nil {
		return w, err
	}
	if w.Until, err = parseTime("--until", *c.until); err != nil {
		return w, err
	}
	w.AggregateType, w.All = *c.aggType, *c.all
	if *c.ids != "" {
		if w.IDs, err = readIDs(*c.ids); err != nil {
			return w, err
		}
		if len(w.IDs) == 0 {
			return w, fmt.Errorf("--ids %s holds no id", *c.ids)
		}
	}
	n := 0
	for _, set := range []bool{!w.Since.IsZero() || !w.Until.IsZero(), w.IDs != nil, w.All} {
		if set {
			n++
		}
	}
	if n != 1 {
		return w, errors.New("give one of --since (with --until), --ids FILE or --all")
	}
	return w, nil
}

// open connects and describes the outbox table.
func (c *recoveryCmd) open(ctx context.Context, args []string) (*pgx.Conn, *recovery.Table, error) {
	if _, err := c.parse(args, 0, true); err != nil {
		return nil, nil, err
	}
	limitMemory(c.cfg)
	conn, err := c.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	t, err := c.openTable(ctx, conn)
	if err != nil {
		conn.Close(context.Background())
		return nil, nil, err
	}
	return conn, t, nil
}

// openTable describes the outbox table of --table, or the only one.
func (c *recoveryCmd) openTable(ctx context.Context, conn *pgx.Conn) (*recovery.Table, error) {
	l, err := c.cfg.Layout(*c.table)
	if err != nil {
		return nil, err
	}
	t, err := recovery.Open(ctx, conn, l)
	if err != nil {
		return nil, err
	}
	t.LimitPayload(c.cfg.MaxMessageBytes())
	return t, nil
}

// sink makes a producer as run's (at-least-once: a replay is a resend
// anyway), and the options of a plain client of the same brokers.
func (c *recoveryCmd) sink(ctx context.Context) (*sink.Sink, []kgo.Opt, error) {
	sc, err := config.SinkConfig(c.cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	sc.Transactions = nil
	sk, err := sink.New(sc)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := sk.Ping(pctx); err != nil {
		sk.Close()
		return nil, nil, fmt.Errorf("kafka.brokers: %w", err)
	}
	return sk, append([]kgo.Opt{kgo.SeedBrokers(sc.Brokers...)}, sc.Opts...), nil
}

// progress shows a count on a terminal's stderr.
func progress(stderr io.Writer, what string) func(int) {
	f, ok := stderr.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return func(n int) { fmt.Fprintf(f, "\r%s %d rows", what, n) }
}

func sortedCounts(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// windowSession is what replay and reconcile work with: the table, the
// window of the flags, and a producer.
type windowSession struct {
	conn *pgx.Conn
	t    *recovery.Table
	w    recovery.Window
	sk   *sink.Sink
	opts []kgo.Opt
}

func (c *recoveryCmd) windowSession(ctx context.Context, args []string) (*windowSession, error) {
	conn, t, err := c.open(ctx, args)
	if err != nil {
		return nil, err
	}
	s := &windowSession{conn: conn, t: t}
	if s.w, err = c.window(); err == nil {
		s.sk, s.opts, err = c.sink(ctx)
	}
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return s, nil
}

func (s *windowSession) close() {
	s.sk.Close()
	s.conn.Close(context.Background())
}

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newRecoveryCmd("replay", stdout, stderr, true)
	ws, err := c.windowSession(ctx, args)
	if err != nil {
		return err
	}
	defer ws.close()
	t, sk, w := ws.t, ws.sk, ws.w
	order, err := t.Order(ctx)
	if err != nil {
		return err
	}
	// With the poll source, the rows its poller has not sent are its own
	// to send, in each aggregate's order: a replay would send them ahead of
	// an earlier unsent row of their aggregate.
	unsent := 0
	if c.cfg.Source == "poll" {
		if unsent, err = t.Unsent(ctx, w); err != nil {
			return err
		}
		w.Sent = true
	}
	start := time.Now()
	sent, err := recovery.Replay(ctx, t, sk, w, !*c.yes, progress(stderr, "read"))
	if err != nil {
		return err
	}
	took := time.Since(start)
	if *c.json {
		return c.printJSON(map[string]any{"dry_run": !*c.yes, "rows": sent.Rows, "unsent_left": unsent, "topics": sent.Topics, "dead_lettered": sent.DeadLettered, "seconds": took.Seconds(),
			"order": order.By, "order_unsure": order.Unsure})
	}
	defer c.printOrder(order)
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tEVENTS")
	for _, k := range sortedCounts(sent.Topics) {
		fmt.Fprintf(tw, "%s\t%d\n", k, sent.Topics[k])
	}
	for _, k := range sortedCounts(sent.DeadLettered) {
		fmt.Fprintf(tw, "%s (dead-lettered: %s)\t%d\n", c.cfg.Kafka.DLQTopic, k, sent.DeadLettered[k])
	}
	tw.Flush()
	if unsent > 0 {
		fmt.Fprintf(c.out, "%d rows of the window not sent yet by the poller (PENDING, SENDING or PARKED): left to it, which sends them in their aggregate's order\n", unsent)
	}
	if !*c.yes {
		fmt.Fprintf(c.out, "would send %d rows of %s (dry run: add --yes to send them)\n", sent.Rows, t.Name())
		return nil
	}
	fmt.Fprintf(c.out, "sent %d rows of %s in %s (%.0f rows/s), each with the header %s\n", sent.Rows, t.Name(), took.Round(time.Millisecond), float64(sent.Rows)/took.Seconds(), recovery.HeaderReplay)
	return nil
}

func cmdReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newRecoveryCmd("reconcile", stdout, stderr, true)
	replay := c.fs.Bool("replay", false, "republish the missing rows (with --yes)")
	wait := c.fs.Duration("wait", 30*time.Second, "how long to wait for the slots to confirm past the reconcile's start")
	var ignore idList
	c.fs.Var(&ignore, "ignore-slot", "a logical slot of the database that does not read the outbox: not waited for (repeatable; every other one is)")
	ws, err := c.windowSession(ctx, args)
	if err != nil {
		return err
	}
	defer ws.close()
	t, sk, w, opts := ws.t, ws.sk, ws.w, ws.opts
	type missingRow struct {
		ID            string `json:"id"`
		AggregateType string `json:"aggregate_type"`
		AggregateID   string `json:"aggregate_id"`
		Time          string `json:"time,omitempty"`
	}
	var missing []missingRow
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	header := false
	rc := &recovery.Reconciler{Table: t, Publisher: sk, Kafka: opts, DLQTopic: c.cfg.Kafka.DLQTopic, Slot: c.cfg.Postgres.Slot, IgnoreSlots: ignore, Wait: *wait, Replay: *replay && *c.yes,
		Poll: c.cfg.Source == "poll",
		OnMissing: func(r recovery.Row) {
			m := missingRow{ID: r.Event.ID, AggregateType: r.Event.AggregateType, AggregateID: r.Event.AggregateID}
			if !r.Time.IsZero() {
				m.Time = r.Time.UTC().Format(time.RFC3339Nano)
			}
			if *c.json {
				missing = append(missing, m)
				return
			}
			if !header {
				fmt.Fprintln(tw, "MISSING ID\tAGGREGATE TYPE\tAGGREGATE ID\tTIME")
				header = true
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.ID, m.AggregateType, m.AggregateID, m.Time)
		}}
	order, err := t.Order(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := rc.Run(ctx, w)
	if err != nil {
		return err
	}
	took := time.Since(start)
	if *c.json {
		doc := map[string]any{"rows": res.Rows, "found": res.Found, "dead_lettered": res.DeadLettered, "id_cut": res.IDCut, "missing": res.Missing, "missing_rows": missing,
			"not_judged": res.NotJudged, "in_flight": res.InFlight, "requeued": res.Requeued, "slot_caught_up": res.SlotCaughtUp, "slot_note": res.SlotNote, "start_lsn": res.Start.String(),
			"replayed": res.Replayed.Rows, "seconds": took.Seconds(), "order": order.By, "order_unsure": order.Unsure, "trimmed_topics": res.Trimmed}
		if err := c.printJSON(doc); err != nil {
			return err
		}
	} else {
		tw.Flush()
		fmt.Fprintf(c.out, "%s: %d rows judged in %s: %d on their topic, %d dead-lettered, %d missing\n", t.Name(), res.Rows, took.Round(time.Millisecond), res.Found, res.DeadLettered, res.Missing)
		if res.InFlight > 0 {
			fmt.Fprintf(c.out, "%d rows of the window in flight (PENDING, SENDING or PARKED): not judged; the poller sends them in their aggregate's order\n", res.InFlight)
		}
		if res.NotJudged > 0 {
			fmt.Fprintf(c.out, "%d rows of the window committed after the reconcile started: not judged\n", res.NotJudged)
		}
		if res.IDCut > 0 {
			fmt.Fprintf(c.out, "%d rows of the window on neither, that a dead letter whose id was cut (walrelay.id_omitted_bytes) may name: id cut, not judged (neither missing nor replayed; dlq replay does not replay such a dead letter either)\n", res.IDCut)
		}
		if !res.SlotCaughtUp {
			fmt.Fprintln(c.out, "note: "+res.SlotNote)
		}
		for _, n := range res.Trimmed {
			fmt.Fprintln(c.out, "warning: "+n+" (reconcile --replay refuses such topics)")
		}
		switch {
		case res.Missing > 0 && *replay && *c.yes && rc.Poll:
			fmt.Fprintf(c.out, "set %d SENT rows missing from their topic back to PENDING: the poller sends them again, each in its aggregate's order (as walrelay poll retry does)\n", res.Requeued)
		case res.Missing > 0 && *replay && rc.Poll:
			fmt.Fprintf(c.out, "would set the %d missing rows back to PENDING for the poller (dry run: add --yes)\n", res.Missing)
		case res.Missing > 0 && *replay && *c.yes:
			fmt.Fprintf(c.out, "replayed the %d missing rows, each with the header %s\n", res.Replayed.Rows, recovery.HeaderReplay)
		case res.Missing > 0 && *replay:
			fmt.Fprintf(c.out, "would replay the %d missing rows (dry run: add --yes)\n", res.Missing)
		}
		if res.Missing > 0 && *replay && !rc.Poll {
			c.printOrder(order)
		}
	}
	// Missing rows that --replay --yes sent are no longer missing (Run
	// returns an error when a send fails): exit 0, as a reconcile after it
	// would.
	if res.Missing > 0 && !rc.Replay {
		return exitCode(2)
	}
	return nil
}

// printOrder says in which order a replay sends the rows, and why that
// may not be the order they were committed in, when the table cannot tell.
func (c *recoveryCmd) printOrder(o recovery.Order) {
	fmt.Fprintf(c.out, "order: %s\n", o.By)
	if o.Unsure != "" {
		fmt.Fprintf(c.out, "note: an aggregate's rows may go out in another order than they were committed in: %s\n", o.Unsure)
	}
}

func cmdPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newRecoveryCmd("prune", stdout, stderr, false)
	olderThan := c.fs.Duration("older-than", 0, "delete rows older than this (at least 1h)")
	batch := c.fs.Int("batch", 1000, "rows a transaction deletes")
	wait := c.fs.Duration("wait", 30*time.Second, "how long to wait for the slots to confirm past the prune's start")
	var ignore idList
	c.fs.Var(&ignore, "ignore-slot", "a logical slot of the database that does not read the outbox: not waited for (repeatable; every other one is)")
	conn, t, err := c.open(ctx, args)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if *olderThan == 0 {
		return errors.New("prune: give --older-than DURATION")
	}
	if *batch <= 0 {
		return errors.New("--batch must be positive")
	}
	show := progress(stderr, "deleted")
	p := &recovery.Pruner{Table: t, Slot: c.cfg.Postgres.Slot, Ignore: ignore, Batch: *batch, Wait: *wait, Dry: !*c.yes, Progress: show, SentOnly: c.cfg.Source == "poll"}
	res, err := p.Run(ctx, *olderThan)
	if err != nil {
		return err
	}
	if *c.json {
		return c.printJSON(map[string]any{"dry_run": !*c.yes, "rows_deleted": res.Deleted, "batches": res.Batches, "seconds": res.Took.Seconds(),
			"longest_batch_seconds": res.LongestBatch.Seconds(), "cutoff": res.Cutoff.UTC().Format(time.RFC3339), "confirmed_lsn": res.Confirmed.String()})
	}
	verb := "deleted"
	if !*c.yes {
		verb = "would delete"
	}
	if c.cfg.Source == "poll" {
		fmt.Fprintf(c.out, "%s %d SENT rows of %s sent more than %s ago (before %s) in %d batches, %s; the longest batch held its locks %s\n",
			verb, res.Deleted, t.Name(), *olderThan, res.Cutoff.UTC().Format(time.RFC3339), res.Batches, res.Took.Round(time.Millisecond),
			res.LongestBatch.Round(time.Millisecond))
	} else {
		fmt.Fprintf(c.out, "%s %d rows of %s older than %s (before %s) in %d batches, %s; the longest batch held its locks %s; slot %s confirmed %s\n",
			verb, res.Deleted, t.Name(), *olderThan, res.Cutoff.UTC().Format(time.RFC3339), res.Batches, res.Took.Round(time.Millisecond),
			res.LongestBatch.Round(time.Millisecond), c.cfg.Postgres.Slot, res.Confirmed)
	}
	if !*c.yes {
		fmt.Fprintln(c.out, "dry run: add --yes to delete them")
	}
	return nil
}
