package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/walrelay/walrelay/poll"
)

// cmdPoll runs the poll source's operator commands: dead lists the DEAD
// rows, retry sets them back to PENDING.
func cmdPoll(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"poll: want dead or retry"}
	}
	c := newRecoveryCmd("poll "+args[0], stdout, stderr, false)
	var limit *int
	var ids idList
	var all *bool
	switch args[0] {
	case "dead":
		limit = c.fs.Int("limit", 1000, "list at most this many rows")
	case "retry":
		c.fs.Var(&ids, "id", "the id of a DEAD row to retry (repeatable)")
		all = c.fs.Bool("all", false, "retry every DEAD row")
	default:
		return usageError{fmt.Sprintf("poll: unknown subcommand %q (want dead or retry)", args[0])}
	}
	if _, err := c.parse(args[1:], 0, false); err != nil {
		return err
	}
	if all != nil && *all == (len(ids) > 0) {
		return usageError{"poll retry: give --id ID (repeatable) or --all"}
	}
	l, err := c.cfg.Layout(*c.table)
	if err != nil {
		return err
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	switch args[0] {
	case "dead":
		rows, err := poll.Dead(ctx, conn, l, *limit)
		if err != nil {
			return err
		}
		if *c.json {
			if rows == nil {
				rows = []poll.DeadRow{}
			}
			return c.printJSON(rows)
		}
		if len(rows) == 0 {
			fmt.Fprintf(c.out, "no DEAD rows in %s\n", l.Name())
			return nil
		}
		fmt.Fprintf(c.out, "%-36s  %-20s  %-20s  %-8s  %-25s  %s\n", "ID", "AGGREGATE", "TYPE", "ATTEMPTS", "CREATED", "LAST ERROR")
		for _, r := range rows {
			fmt.Fprintf(c.out, "%-36s  %-20s  %-20s  %-8d  %-25s  %s\n", r.ID, r.AggregateType+"/"+r.AggregateID, r.Type, r.Attempts, r.CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z"), r.LastError)
		}
		if len(rows) == *limit {
			fmt.Fprintf(c.out, "(the first %d; --limit N for more)\n", *limit)
		}
		return nil
	default:
		n, notDead, err := poll.Retry(ctx, conn, l, ids, *all, !*c.yes)
		if err != nil {
			return err
		}
		if *c.json {
			if notDead == nil {
				notDead = []string{}
			}
			return c.printJSON(map[string]any{"dry_run": !*c.yes, "rows": n, "not_dead": notDead})
		}
		verb := "set"
		if !*c.yes {
			verb = "would set"
		}
		fmt.Fprintf(c.out, "%s %d DEAD rows of %s back to PENDING (attempts reset to 0)\n", verb, n, l.Name())
		if len(notDead) > 0 {
			fmt.Fprintf(c.out, "not DEAD rows, left as they are: %s\n", strings.Join(notDead, ", "))
		}
		if !*c.yes {
			fmt.Fprintln(c.out, "dry run: add --yes to retry them")
		}
		return nil
	}
}
