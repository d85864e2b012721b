package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/internal/noredirect"
	"github.com/walrelay/walrelay/replication"
)

// adminCmd is the shared set-up of the operator commands: configuration,
// --json, a connection.
type adminCmd struct {
	fs   *flag.FlagSet
	cs   *config.Set
	json *bool
	cfg  *config.Config
	out  io.Writer
}

func newAdminCmd(name string, stderr, stdout io.Writer) *adminCmd {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &adminCmd{fs: fs, cs: config.NewSet(fs), json: fs.Bool("json", false, "print one JSON document"), out: stdout}
}

// parse parses flags and positional arguments (at most maxArgs), which may
// stand before or after the flags.
func (a *adminCmd) parse(args []string, maxArgs int, needKafka bool) ([]string, error) {
	pos, err := parseArgs(a.fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) > maxArgs {
		return nil, usageError{fmt.Sprintf("unexpected argument %q", pos[maxArgs])}
	}
	cfg, err := a.cs.Load(a.fs, needKafka)
	if err != nil {
		return nil, err
	}
	a.cfg = cfg
	return pos, nil
}

// open parses args (one optional name, defaulting to def), loads the
// configuration and connects.
func (a *adminCmd) open(ctx context.Context, args []string, def func(*config.Config) string) (name string, named bool, conn *pgx.Conn, err error) {
	pos, err := a.parse(args, 1, false)
	if err != nil {
		return "", false, nil, err
	}
	name = def(a.cfg)
	if len(pos) == 1 {
		name, named = pos[0], true
	}
	conn, err = a.connect(ctx)
	return name, named, conn, err
}

func (a *adminCmd) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := connectDSN(cctx, a.cfg)
	return conn, config.ScrubError(err, a.cfg.Secrets())
}

func (a *adminCmd) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func orDash[T any](p *T, f func(T) string) string {
	if p == nil {
		return "-"
	}
	return f(*p)
}

func cmdSlot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"slot: want list, status, create, drop or resync"}
	}
	if args[0] == "resync" {
		return cmdSlotResync(ctx, args[1:], stdout, stderr)
	}
	a := newAdminCmd("slot "+args[0], stderr, stdout)
	yes := a.fs.Bool("yes", false, "drop: really drop the slot (without it, only say what would be done)")
	name, named, conn, err := a.open(ctx, args[1:], func(c *config.Config) string { return c.Postgres.Slot })
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	switch args[0] {
	case "list", "status":
		if args[0] == "list" {
			name = ""
		}
		slots, err := replication.Slots(ctx, conn, name)
		if err != nil {
			return err
		}
		if *a.json {
			return a.printJSON(slots)
		}
		tw := tabwriter.NewWriter(a.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SLOT\tPLUGIN\tACTIVE\tPID\tRESTART_LSN\tCONFIRMED_FLUSH_LSN\tRETAINED_WAL\tLAG\tWAL_STATUS\tSAFE_WAL_SIZE\tINACTIVE_SINCE")
		str := func(s string) string { return s }
		itoa := func(i int) string { return fmt.Sprint(i) }
		for _, s := range slots {
			fmt.Fprintf(tw, "%s\t%s\t%t\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.SlotName, s.Plugin, s.Active, orDash(s.ActivePID, itoa),
				orDash(s.RestartLSN, str), orDash(s.ConfirmedFlushLSN, str), orDash(s.RetainedWALBytes, admin.HumanBytes), orDash(s.LagBytes, admin.HumanBytes),
				orDash(s.WALStatus, str), orDash(s.SafeWALSize, admin.HumanBytes), orDash(s.InactiveSince, str))
		}
		return tw.Flush()
	case "create":
		if !replication.ValidSlotName(name) {
			return fmt.Errorf("slot name %q: use 1 to 63 lower-case letters, digits and underscores", name)
		}
		// The operator's explicit word: also a slot that walrelay created
		// and that is gone (which run and migrate refuse to recreate).
		created, err := replication.EnsureSlot(ctx, conn, name, a.cfg.Postgres.Publication, true)
		if err != nil {
			return err
		}
		return a.say(map[string]any{"slot_name": name, "created": created}, "slot %s %s", name, createdWord(created))
	case "drop":
		if !named {
			return usageError{"slot drop: name the slot to drop"}
		}
		st, err := replication.DropSlot(ctx, conn, name, !*yes)
		if err != nil {
			return err
		}
		if !*yes {
			return a.say(map[string]any{"slot_name": name, "dropped": false, "dry_run": true},
				"would drop slot %s (confirmed %s, retaining %s of WAL): rows committed after its position are then no longer in the WAL stream (dry run: add --yes to drop it)",
				name, orDash(st.ConfirmedFlushLSN, func(s string) string { return s }), orDash(st.RetainedWALBytes, admin.HumanBytes))
		}
		return a.say(map[string]any{"slot_name": name, "dropped": true}, "slot %s dropped", name)
	}
	return usageError{fmt.Sprintf("slot %s: want list, status, create or drop", args[0])}
}

func createdWord(created bool) string {
	if created {
		return "created"
	}
	return "already exists"
}

// say prints v as JSON with --json, else the sentence.
func (a *adminCmd) say(v any, format string, args ...any) error {
	if *a.json {
		return a.printJSON(v)
	}
	_, err := fmt.Fprintf(a.out, format+"\n", args...)
	return err
}

func cmdLSN(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"lsn: want show or advance"}
	}
	a := newAdminCmd("lsn "+args[0], stderr, stdout)
	to := a.fs.String("to", "", "advance: the LSN to move the slot to")
	toCurrent := a.fs.Bool("to-current", false, "advance: move the slot to the server's current WAL position")
	yes := a.fs.Bool("yes", false, "advance: really do it (without it, only say what would be done)")
	name, _, conn, err := a.open(ctx, args[1:], func(c *config.Config) string { return c.Postgres.Slot })
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	slots, err := replication.Slots(ctx, conn, name)
	if err != nil {
		return err
	}
	s := slots[0]
	confirmed := orDash(s.ConfirmedFlushLSN, func(x string) string { return x })
	switch args[0] {
	case "show":
		var lag int64
		if s.LagBytes != nil {
			lag = *s.LagBytes
		}
		return a.say(map[string]any{"slot_name": name, "confirmed_flush_lsn": s.ConfirmedFlushLSN, "current_wal_lsn": s.CurrentWALLSN,
			"lag_bytes": s.LagBytes}, "slot %s: confirmed %s, server at %s, %d bytes (%s) behind", name, confirmed, s.CurrentWALLSN, lag, admin.HumanBytes(lag))
	case "advance":
		if (*to == "") == !*toCurrent {
			return usageError{"lsn advance: give --to LSN or --to-current"}
		}
		target := *to
		if *toCurrent {
			target = s.CurrentWALLSN
		}
		lsn, err := pglogrepl.ParseLSN(target)
		if err != nil {
			return fmt.Errorf("--to %q: %w", target, err)
		}
		was, now, err := replication.AdvanceSlot(ctx, conn, name, lsn, !*yes)
		if err != nil {
			return err
		}
		skipped := int64(now - was)
		doc := map[string]any{"slot_name": name, "from": was.String(), "to": now.String(), "skipped_bytes": skipped, "done": *yes}
		if !*yes {
			return a.say(doc, "would move slot %s from %s to %s, skipping %d bytes (%s) of WAL and every event in it (walrelay reconcile and replay can send them from the outbox table later); add --yes to do it",
				name, was, now, skipped, admin.HumanBytes(skipped))
		}
		return a.say(doc, "moved slot %s from %s to %s, skipping %d bytes (%s) of WAL; walrelay reconcile %s lists the rows skipped that are still in the table, and --replay --yes sends them",
			name, was, now, skipped, admin.HumanBytes(skipped), reconcileWindow(ctx, a.cfg, conn.Config(), "a time before the skipped rows"))
	}
	return usageError{fmt.Sprintf("lsn %s: want show or advance", args[0])}
}

func cmdPublication(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"publication: want show, create or drop"}
	}
	a := newAdminCmd("publication "+args[0], stderr, stdout)
	yes := a.fs.Bool("yes", false, "drop: really drop the publication (without it, only say what would be done)")
	name, named, conn, err := a.open(ctx, args[1:], func(c *config.Config) string { return c.Postgres.Publication })
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	switch args[0] {
	case "show":
		p, err := replication.Publication(ctx, conn, name)
		if err != nil {
			return err
		}
		if *a.json {
			return a.printJSON(p)
		}
		fmt.Fprintf(a.out, "publication %s\n  publish: %s\n  tables:  %s\n", p.Name, strings.Join(p.Publish, ", "), publicationTables(p))
		return nil
	case "create":
		spec := a.cfg.PublicationSpec(name)
		// Never a publication behind a slot no one reads: the slot could
		// not be streamed with it.
		behind, err := replication.NewPublicationBehindSlot(ctx, conn, name, a.cfg.Postgres.Slot, true)
		if err != nil {
			return err
		}
		created, added, err := replication.EnsurePublication(ctx, conn, spec)
		if err != nil {
			return err
		}
		if behind != "" && !*a.json {
			defer fmt.Fprintf(a.out, "note: %s\n", behind)
		}
		// The slot walrelay is to stream with it, if it exists (Debezium's,
		// taken over), is recorded on the publication: dropped later (as
		// Debezium's slot.drop.on.stop=true does), run says it is gone
		// instead of creating a new one at the end of the WAL.
		if slot := a.cfg.Postgres.Slot; name == a.cfg.Postgres.Publication {
			if recorded, err := replication.RecordSlot(ctx, conn, name, slot); err != nil {
				return err
			} else if recorded && !*a.json {
				defer fmt.Fprintf(a.out, "slot %s recorded on publication %s: if it is dropped, walrelay run stops and says so, instead of creating a new slot after the rows committed meanwhile\n", slot, name)
			}
		}
		if len(added) > 0 {
			return a.say(map[string]any{"name": name, "created": false, "added": added}, "publication %s: added %s (rows written to them before now are not in the stream)", name, strings.Join(added, ", "))
		}
		return a.say(map[string]any{"name": name, "created": created}, "publication %s for %s %s", name, spec.Names(), createdWord(created))
	case "drop":
		if !named {
			return usageError{"publication drop: name the publication to drop"}
		}
		p, err := replication.DropPublication(ctx, conn, name, !*yes)
		if err != nil {
			return err
		}
		if !*yes {
			return a.say(map[string]any{"name": name, "dropped": false, "dry_run": true},
				"would drop publication %s (of %s): a slot streaming through it stops, and a publication created again later is after that slot's position, so the slot cannot be streamed with it (walrelay slot resync then) (dry run: add --yes to drop it)", name, publicationTables(p))
		}
		return a.say(map[string]any{"name": name, "dropped": true}, "publication %s dropped", name)
	}
	return usageError{fmt.Sprintf("publication %s: want show, create or drop", args[0])}
}

// publicationTables is the tables a publication publishes, as a phrase.
func publicationTables(p replication.PublicationInfo) string {
	if p.AllTables {
		return "all tables"
	}
	return strings.Join(p.Tables, ", ")
}

// cmdStatus asks a running instance for its state through its admin
// listener.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := config.NewSet(fs)
	asJSON := fs.Bool("json", false, "print one JSON document")
	ready := fs.Bool("ready", false, "ask /readyz instead: exit 0 only while the instance streams or polls (a container's health check)")
	standby := fs.Bool("standby", false, "with --ready: waiting for the slot another instance streams counts as ready")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// Only admin.listen matters here: take the configuration without
	// requiring the DSN or brokers.
	if cs.File() != "" {
		if err := cs.LoadFile(cs.File()); err != nil {
			return err
		}
	}
	addr := cs.Config().Admin.Listen
	if v, ok := os.LookupEnv(config.EnvName("admin.listen")); ok {
		addr = v
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "admin.listen" {
			addr = f.Value.String()
		}
	})
	if addr == "" {
		return errors.New("admin.listen is empty: the instance has no admin listener to ask")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if *ready {
		return askReady(cctx, addr, *standby, stdout)
	}
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/status", nil)
	resp, err := adminClient.Do(req)
	if err != nil {
		return unanswered(addr, err)
	}
	defer resp.Body.Close()
	var st admin.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		detail := resp.Status
		if err != nil && resp.StatusCode == http.StatusOK {
			detail += ", " + err.Error()
		}
		return fmt.Errorf("the server at admin address %s does not answer as a walrelay admin listener (%s): %s", addr, detail, pointElsewhere)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "state\t%s\n", st.State)
	fmt.Fprintf(tw, "waiting for\t%s\n", st.WaitingFor)
	if st.Kafka.Answering {
		fmt.Fprintf(tw, "kafka\tanswering\n")
	} else {
		fmt.Fprintf(tw, "kafka\tNOT ANSWERING since %s: %s\n", st.Kafka.Since, st.Kafka.Problem)
	}
	if x := st.Kafka.Refusing; x != nil {
		rule := "held and retried for as long as it lasts"
		if x.Persistent {
			rule = "held and retried; stops after " + x.StopsAfter
		}
		fmt.Fprintf(tw, "kafka refuses\tthe event at %s with %s since %s (%d sessions in a row): %s\n", x.LSN, x.Code, x.Since, x.Sessions, rule)
	}
	if r := st.SchemaRegistry; r != nil && r.Answering {
		fmt.Fprintf(tw, "schema registry\tanswering\n")
	} else if r != nil && r.WrongURL {
		fmt.Fprintf(tw, "schema registry\tWRONG URL (not Confluent's API: check kafka.schema_registry.url) since %s: %s\n", r.Since, r.Problem)
	} else if r != nil {
		fmt.Fprintf(tw, "schema registry\tNOT ANSWERING since %s: %s\n", r.Since, r.Problem)
	}
	if st.Source == "poll" {
		fmt.Fprintf(tw, "source\tpoll\n")
		for _, p := range st.Poll {
			fmt.Fprintf(tw, "%s: due / oldest due\t%d / %.1fs\n", p.Table, p.Due, p.OldestDueSeconds)
			fmt.Fprintf(tw, "%s: pending / sending / expired leases / dead / parked\t%d / %d / %d / %d / %d\n", p.Table, p.Pending, p.Sending, p.ExpiredLeases, p.Dead, p.Parked)
		}
	} else {
		fmt.Fprintf(tw, "slot\t%s\n", st.Slot)
		fmt.Fprintf(tw, "slot lag\t%s\n", orDash(st.SlotLagBytes, admin.HumanBytes))
		fmt.Fprintf(tw, "retained WAL\t%s\n", orDash(st.RetainedWALBytes, admin.HumanBytes))
		fmt.Fprintf(tw, "received / confirmed\t%s / %s\n", st.ReceivedLSN, st.ConfirmedLSN)
	}
	fmt.Fprintf(tw, "events/s (last minute)\t%.1f\n", st.EventsPerSecond)
	fmt.Fprintf(tw, "in flight\t%d\n", st.InFlight)
	fmt.Fprintf(tw, "published / dead-lettered\t%d / %d\n", st.Published, st.DeadLettered)
	fmt.Fprintf(tw, "seconds behind source\t%.3f\n", st.SecondsBehindSource)
	if x := st.ExactlyOnce; x != nil {
		fmt.Fprintf(tw, "exactly once: committed position\t%s\n", x.CommittedPosition)
		fmt.Fprintf(tw, "kafka transactions committed / aborted\t%d / %d\n", x.TransactionsCommitted, x.TransactionsAborted)
	}
	if st.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", st.Error)
	}
	return tw.Flush()
}

// askReady asks the instance at addr for /readyz (?standby=1 if standby),
// prints its answer, and fails unless it is ready.
// pointElsewhere says how to point walrelay status at another instance.
const pointElsewhere = "point walrelay status at the instance's admin listener with --admin.listen host:port, WALRELAY_ADMIN_LISTEN, or admin.listen in the file of --config"

// adminClient is status's client of the admin listener. It follows no
// redirect: the answer of the server that a redirect points at would be
// printed as the instance's.
var adminClient = noredirect.Client(nil, 0)

// unanswered is status's error when its request to addr failed (err): a
// redirect refused (something answered, not as walrelay does), else
// noInstance.
func unanswered(addr string, err error) error {
	var refused *noredirect.Error
	if errors.As(err, &refused) {
		return fmt.Errorf("the server at admin address %s does not answer as a walrelay admin listener (%v): %s", addr, refused, pointElsewhere)
	}
	return noInstance(addr, err)
}

// noInstance is status's error when nothing answered at addr (err: the
// request's): no walrelay runs there, or it listens elsewhere.
func noInstance(addr string, err error) error {
	why := err.Error()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		why = "connection refused"
	case errors.Is(err, context.DeadlineExceeded):
		why = "no answer within 5 s"
	}
	return fmt.Errorf("no walrelay answers at admin address %s (%s): is it running, with this admin.listen? To ask an instance that listens elsewhere, %s", addr, why, pointElsewhere)
}

func askReady(ctx context.Context, addr string, standby bool, stdout io.Writer) error {
	url := "http://" + addr + "/readyz"
	if standby {
		url += "?standby=1"
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := adminClient.Do(req)
	if err != nil {
		return unanswered(addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return fmt.Errorf("the server at admin address %s does not answer as a walrelay admin listener (%s): %s", addr, resp.Status, pointElsewhere)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprint(stdout, string(body))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("not ready (%s)", resp.Status)
	}
	return nil
}
