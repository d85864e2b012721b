package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := config.NewSet(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := cs.Load(fs, false)
	if err != nil {
		return err
	}
	return config.ScrubError(migrate(ctx, cfg, stdout), cfg.Secrets())
}

// migrate creates the outbox table, its publication and the slot, in that
// order (a slot sees only a publication older than the changes it decodes),
// and says for each whether it was created or already there.
func migrate(ctx context.Context, cfg *config.Config, stdout io.Writer) error {
	schema, table, _ := cfg.Table()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(cctx, cfg.Postgres.DSN)
	if err != nil {
		return fmt.Errorf("postgres.dsn: connect: %w", err)
	}
	defer conn.Close(context.Background())
	say := func(what string, created bool) {
		state := "already exists"
		if created {
			state = "created"
		}
		fmt.Fprintf(stdout, "%-40s %s\n", what, state)
	}
	res, err := migrations.Apply(cctx, conn, cfg.OutboxConfig())
	if err != nil {
		return err
	}
	say("table "+schema+"."+table, res.TableCreated)
	// A table that existed is left as it is: it must have the configured
	// layout.
	if err := relay.CheckTable(cctx, conn, cfg.OutboxConfig()); err != nil {
		return err
	}
	created, err := replication.EnsurePublication(cctx, conn, cfg.PublicationSpec(cfg.Postgres.Publication))
	if err != nil {
		return err
	}
	say("publication "+cfg.Postgres.Publication, created)
	created, err = replication.EnsureSlot(cctx, conn, cfg.Postgres.Slot, cfg.Postgres.Publication, false)
	if err != nil {
		return err
	}
	say("replication slot "+cfg.Postgres.Slot, created)
	return nil
}
