package main

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

// usableTypes are the column types walrelay reads for each column it
// reads, as format_type writes them (the decoder's own rules).
var usableTypes = map[string][]string{
	"id":            {"uuid", "text", "character varying", "character", "bigint", "integer"},
	"aggregatetype": {"text", "character varying", "character", "name"},
	"aggregateid":   {"text", "character varying", "character", "uuid", "bigint", "integer", "smallint", "numeric", "name"},
	"type":          {"text", "character varying", "character", "name"},
	"payload":       {"jsonb", "json", "text", "character varying", "bytea"},
	"version":       relay.VersionTypes,
	"partition":     {"smallint", "integer", "bigint"},
	"timestamp":     {"timestamp with time zone", "timestamp without time zone", "date"},
	"trace":         {"text", "character varying", "character"},
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkTable adds the checks of one outbox table: it exists, has each
// column walrelay reads in a usable type, and for source wal (wal) none
// generated, and the role may publish it. With several tables, each
// check's name ends with the table's.
func checkTable(cctx context.Context, conn *pgx.Conn, l decoder.Layout, several, wal bool, pubErr error, add func(name, status, format string, args ...any)) {
	schema, table, qualified := l.Schema, l.Table, l.Name()
	// With several tables, each check names its table.
	name := func(s string) string {
		if several {
			return s + " " + qualified
		}
		return s
	}
	colName := func(c string) string {
		if several {
			return "column " + qualified + "." + c
		}
		return "column " + c
	}
	_, cols, err := relay.TableColumns(cctx, conn, schema, table)
	if err != nil {
		add(name("outbox table"), "fail", "read the columns of %s: %v", qualified, err)
	}
	switch {
	case err != nil: // reported above
	case len(cols) == 0:
		add(name("outbox table"), "fail", "table %s does not exist: create it with walrelay migrate, or set postgres.table or outbox.tables", qualified)
	default:
		add(name("outbox table"), "ok", "%s exists", qualified)
		for _, c := range relay.Columns(l) {
			typ, ok := cols[c.Name]
			switch {
			case !ok && c.Role == "header":
				add(colName(c.Name), "fail", "table %s has no column %q (outbox.header_columns)", qualified, c.Name)
			case !ok:
				key := c.Key
				if several {
					key = strings.TrimPrefix(c.Key, "outbox.") + " of its outbox.tables entry, else " + c.Key
				}
				add(colName(c.Name), "fail", "table %s has no column %q (%s): add it, or point %s at another column", qualified, c.Name, key, key)
			case c.Role == "header":
			case !contains(usableTypes[c.Role], typ):
				add(colName(c.Name), "fail", "column %q is %s; as the %s column it must be one of %s", c.Name, typ, c.Role, strings.Join(usableTypes[c.Role], ", "))
			default:
				add(colName(c.Name), "ok", "%s", typ)
			}
		}
		if !wal {
			return
		}
		if generated, err := relay.GeneratedColumns(cctx, conn, l); err != nil {
			add(name("generated columns"), "fail", "%v", err)
		} else if len(generated) > 0 {
			add(name("generated columns"), "fail", "%s GENERATED: logical replication does not send generated columns; store the value in a plain column", strings.Join(generated, ", "))
		}
		if err := replication.CheckTableOwner(cctx, conn, schema, table); err != nil {
			status := "warn"
			if pubErr != nil {
				status = "fail" // the publication must still be created, which needs ownership
			}
			add(name("table ownership"), status, "%v", err)
		} else {
			add(name("table ownership"), "ok", "the role may create the publication")
		}
	}
}

// checkPoll adds the checks of source poll: each table's columns,
// and what the poll source needs of it (migrate --poll), and the role's
// privileges; logical replication is not needed.
func checkPoll(ctx context.Context, conn *pgx.Conn, cfg *config.Config, add func(name, status, format string, args ...any)) {
	add("source", "ok", "poll: the outbox table is polled; logical replication, the slot and the publication are not needed")
	layouts := cfg.OutboxConfig().Layouts()
	for _, l := range layouts {
		checkTable(ctx, conn, l, len(layouts) > 1, false, nil, add)
		name := "poll table"
		if len(layouts) > 1 {
			name += " " + l.Name()
		}
		if err := relay.CheckChildPrivileges(ctx, conn, l); err != nil {
			add("partitions", "fail", "%v", err)
		}
		if err := poll.CheckTable(ctx, conn, l); err != nil {
			add(name, "fail", "%v", err)
			continue
		}
		var sel, upd bool
		q := pgx.Identifier{l.Schema, l.Table}.Sanitize()
		if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1, 'SELECT'), has_table_privilege($1, 'UPDATE')", q).Scan(&sel, &upd); err != nil {
			add(name, "fail", "read the role's privileges on %s: %v", l.Name(), err)
			continue
		}
		if !sel || !upd {
			add(name, "fail", "the role may not SELECT and UPDATE %s, which the poll source does: GRANT SELECT, UPDATE ON %s TO <walrelay's role>", l.Name(), q)
			continue
		}
		add(name, "ok", "%s has the poll columns, indexes and insert trigger; the role may select and update it", l.Name())
	}
	if err := relay.CheckEmitFunction(ctx, conn, cfg.OutboxConfig()); err != nil {
		add("walrelay_emit", "fail", "%v (source poll: walrelay migrate --poll)", err)
	}
}
