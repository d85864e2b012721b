package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/shellquote"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := config.NewSet(fs)
	inbox := fs.Bool("inbox", false, "create only the inbox table of package inbox and its claim function, in the consumer's database that postgres.dsn names (no outbox, publication or slot)")
	inboxTable := fs.String("inbox-table", "public.walrelay_inbox", "the inbox table that --inbox creates, schema.table")
	pollCols := fs.Bool("poll", false, "for source poll: create the outbox table if missing and add the poll source's columns, indexes and insert trigger (no publication or slot); implied by source: poll")
	existing := fs.String("existing-rows", "", "with --poll, for a table that holds rows and gets the status column now: sent (the WAL source or another relay published them: they become SENT) or pending (the poll source sends them, ties within an aggregate in their physical insertion order); required for such a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := cs.Load(fs, false)
	if err != nil {
		return err
	}
	if *inbox {
		return config.ScrubError(migrateInbox(ctx, cfg, *inboxTable, stdout), cfg.Secrets())
	}
	return config.ScrubError(migrate(ctx, cfg, *pollCols || cfg.Source == "poll", *existing, stdout), cfg.Secrets())
}

// migrateInbox creates the inbox table schema.table and its claim
// function, and says whether the table was created.
func migrateInbox(ctx context.Context, cfg *config.Config, name string, stdout io.Writer) error {
	schema, table, ok := strings.Cut(name, ".")
	if !ok || schema == "" || table == "" || strings.Contains(table, ".") {
		return fmt.Errorf("--inbox-table %q: want schema.table", name)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := connectDSN(cctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var existed bool
	if err := conn.QueryRow(cctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&existed); err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if err := migrations.ApplyInbox(cctx, conn, schema, table); err != nil {
		return err
	}
	state := "created"
	if existed {
		state = "already exists"
	}
	fmt.Fprintf(stdout, "%-40s %s\n", "table "+name, state)
	fmt.Fprintf(stdout, "%-40s %s\n", "function "+schema+"."+table+"_claim", "created or replaced")
	return nil
}

// migrate creates the outbox table, its publication and the slot, in that
// order (a slot sees only a publication older than the changes it decodes),
// and says for each whether it was created or already there. With poll
// (source poll) it gives the tables the poll source's columns, indexes and
// trigger instead of a publication and a slot.
func migrate(ctx context.Context, cfg *config.Config, poll bool, existing string, stdout io.Writer) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := connectDSN(cctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	say := func(what string, created bool) {
		state := "already exists"
		if created {
			state = "created"
		}
		fmt.Fprintf(stdout, "%-40s %s\n", what, state)
	}
	if !poll {
		// Checked first: a server walrelay cannot stream from is left as
		// it was.
		if err := relay.CheckServer(cctx, conn); err != nil {
			return fmt.Errorf("%w; migrate changed nothing", err)
		}
		if err := replication.CheckSlotOwner(cctx, conn, cfg.Postgres.Slot); err != nil {
			return fmt.Errorf("%w; migrate changed nothing", err)
		}
	}
	res, err := migrations.Apply(cctx, conn, cfg.OutboxConfig())
	if err != nil {
		return err
	}
	ocfg := cfg.OutboxConfig()
	for _, l := range ocfg.Layouts() {
		say("table "+l.Name(), slices.Contains(res.Created, l.Name()))
		if slices.Contains(res.CreatedAt, l.Name()) && !slices.Contains(res.Created, l.Name()) {
			fmt.Fprintf(stdout, "%-40s %s\n", "column "+l.Name()+"."+migrations.CreatedAt, "added: the time of each insert, which the time windows of reconcile, replay and prune use (the rows already there are of unknown time, 1970-01-01 in it: a window with a start leaves them out but UUIDv7 ids, placed by their time; --all or --ids FILE reach them)")
		}
		if stmt, ok := res.CreatedAtIndex[l.Name()]; ok {
			fmt.Fprintf(stdout, "%-40s %s\n", "index of "+l.Name()+"."+migrations.CreatedAt, "not built: the table is large, and building it here would hold its writers; for fast time windows run "+stmt)
		}
		if poll {
			continue // checked once it has the poll columns
		}
		// A table that existed is left as it is: it must have the
		// configured layout.
		if err := relay.CheckTable(cctx, conn, l); err != nil {
			return err
		}
	}
	if poll {
		return migratePoll(cctx, conn, ocfg, existing, stdout)
	}
	if res.EmitNotCreated != nil {
		// The tables passed their check, so this is not a missing column
		// of the configuration's: say it as it is.
		return res.EmitNotCreated
	}
	emit := ocfg.Schema + "." + migrations.EmitFunction
	var privErr error
	if !ocfg.Messages {
		fmt.Fprintf(stdout, "%-40s %s\n", "function "+emit, "inserts a row into "+ocfg.Name()+" (outbox.messages off)")
	} else {
		// Whether the message source was secure already, with its horizon
		// recorded: then the horizon stays, and messages that writers
		// emitted since and walrelay has not read yet are still published.
		wasSecure := relay.CheckMessagePrivileges(cctx, conn, ocfg) == nil
		horizon, had, err := migrations.MessageHorizon(cctx, conn, ocfg)
		if err != nil {
			return err
		}
		stmts, err := migrations.SecureMessages(cctx, conn, ocfg)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-40s %s\n", "function "+emit, "emits a logical decoding message under "+ocfg.MessagePrefix+" (outbox.messages on)")
		for _, s := range stmts {
			fmt.Fprintf(stdout, "%-40s %s\n", "privileges", s)
		}
		// PostgreSQL only warns when a role that may not change the
		// privileges tries: see whether they are right now (the
		// publication and the slot are made either way).
		if err := relay.CheckMessagePrivileges(cctx, conn, ocfg); err != nil {
			privErr = fmt.Errorf("%w (migrate could not change them: that needs a superuser)", err)
		} else {
			recorded := !wasSecure || !had
			if recorded {
				// Any role may have emitted a message before now, in a
				// transaction committed since walrelay last confirmed or
				// still open: from here on only writers can.
				if horizon, err = migrations.RecordMessageHorizon(cctx, conn, ocfg); err != nil {
					return err
				}
			}
			now := ""
			if recorded {
				now = ", recorded now"
			}
			fmt.Fprintf(stdout, "%-40s messages are trusted from transaction %d; those of older transactions are dead-lettered (message_before_privileges)%s\n", "message horizon", horizon, now)
		}
	}
	// Never a publication behind a slot no one reads (a switch-over from
	// Debezium on its slot): the slot could not be streamed with it.
	behind, err := replication.NewPublicationBehindSlot(cctx, conn, cfg.Postgres.Publication, cfg.Postgres.Slot, true)
	if err != nil {
		return err
	}
	created, added, err := replication.EnsurePublication(cctx, conn, cfg.PublicationSpec(cfg.Postgres.Publication))
	if behind != "" && err == nil {
		defer fmt.Fprintf(stdout, "note: %s\n", behind)
	}
	for _, t := range added {
		fmt.Fprintf(stdout, "%-40s %s\n", "publication "+cfg.Postgres.Publication, "table "+t+" added (rows written to it before now are not in the stream: walrelay replay --table "+shellquote.Arg(t)+" sends them)")
	}
	if err != nil {
		return err
	}
	if len(added) == 0 {
		say("publication "+cfg.Postgres.Publication, created)
	}
	created, err = replication.EnsureSlot(cctx, conn, cfg.Postgres.Slot, cfg.Postgres.Publication, false)
	if err != nil {
		return err
	}
	say("replication slot "+cfg.Postgres.Slot, created)
	return privErr
}

// connectDSN connects to postgres.dsn.
func connectDSN(ctx context.Context, cfg *config.Config) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, cfg.Postgres.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn: connect: %w", err)
	}
	return conn, nil
}

// migratePoll gives the outbox tables of o what the poll source needs, and
// says what it did.
func migratePoll(ctx context.Context, conn *pgx.Conn, o decoder.Config, existing string, stdout io.Writer) error {
	res, err := migrations.ApplyPollWith(ctx, conn, o, migrations.PollOptions{ExistingRows: existing})
	if err != nil {
		return err
	}
	for _, l := range o.Layouts() {
		for _, stmt := range res.Unbuilt[l.Name()] {
			fmt.Fprintf(stdout, "%-40s %s\n", "index of "+l.Name(), "not built: the table is large, and building it here would hold its writers; the poll source refuses the table until it is built: run "+stmt)
		}
		if err := poll.CheckTable(ctx, conn, l); err != nil {
			return err
		}
		added := "present"
		if a := res.Added[l.Name()]; len(a) > 0 {
			added = "added " + strings.Join(a, ", ")
		}
		fmt.Fprintf(stdout, "%-40s %s\n", "poll columns of "+l.Name(), added)
		if def, ok := res.Redefaulted[l.Name()]; ok {
			fmt.Fprintf(stdout, "%-40s default was %s (the transaction's time): set to clock_timestamp(), so that one transaction's rows keep their insert order\n", "created_at of "+l.Name(), def)
		}
		if n := res.Pending[l.Name()]; n > 0 {
			fmt.Fprintf(stdout, "%-40s %d rows that were there are PENDING (--existing-rows pending): the poll source sends them; %d rows of one aggregate that shared a created_at were stamped a microsecond apart in their physical insertion order (age of the writing transaction, then place in the table: the insert order for a table only ever inserted into)\n", "", n, res.Stamped[l.Name()])
		}
		if n := res.Sent[l.Name()]; n > 0 {
			fmt.Fprintf(stdout, "%-40s %d rows that were there are SENT (--existing-rows sent): the poll source does not send them\n", "", n)
		}
		if n := res.Tied[l.Name()]; n > 0 {
			fmt.Fprintf(stdout, "%-40s warning: %d unsent rows share their created_at with another unsent row of their aggregate (written under the old default): they go out in the order of their ids, which need not be the order they were written in\n", "", n)
		}
		names := migrations.PollNamesOf(l)
		fmt.Fprintf(stdout, "%-40s %s\n", "indexes "+names.DueIndex+", "+names.UnsentIndex+", "+names.ParkedIndex, "present")
		fmt.Fprintf(stdout, "%-40s %s\n", "trigger "+names.Trigger, "present (NOTIFY "+migrations.NotifyChannel+")")
	}
	return nil
}
