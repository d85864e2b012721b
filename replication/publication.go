package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/shellquote"
	"github.com/walrelay/walrelay/internal/sqlquote"
)

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ident renders a possibly qualified name for an SQL statement that an
// error suggests: each part quoted only where it must be.
func ident(parts ...string) string {
	for i, p := range parts {
		if !plainIdent.MatchString(p) {
			parts[i] = pgx.Identifier{p}.Sanitize()
		}
	}
	return strings.Join(parts, ".")
}

// quoteLiteral quotes s as a string literal of a replication command
// (START_REPLICATION's options), whose scanner reads a doubled quote as one and
// knows no backslash escapes, whatever standard_conforming_strings says.
// SQL statements use sqlquote.Literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// ValidPublicationName reports whether s is usable as a publication name:
// any name walrelay writes into SQL as it is (sqlquote.CheckName: 1 to 63
// bytes of UTF-8 without a control character; it is quoted wherever it is
// used, so case and punctuation are kept).
func ValidPublicationName(s string) bool {
	return sqlquote.CheckName(s) == nil
}

// Outbox is what walrelay's publication must publish: the outbox tables
// alone, their inserts, every column walrelay reads.
type Outbox struct {
	Publication string
	// Tables are the outbox tables, at least one.
	Tables []Table
	// AllowRowFilter accepts a row filter on the tables: a shard of a
	// sharded outbox (every row must then match another shard's filter).
	// A row filter drops the rows it does not match, unpublished.
	AllowRowFilter bool
}

// Table is one outbox table of a publication.
type Table struct {
	Schema, Name string
	// Columns are the columns walrelay reads: a column list of the
	// publication must keep each.
	Columns []string
}

// qualified is the table's name for an SQL statement an error suggests.
func (t Table) qualified() string { return ident(t.Schema, t.Name) }

// sanitized is the table's name quoted for SQL walrelay runs.
func (t Table) sanitized() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Names lists the outbox tables, comma-separated, as an SQL statement names
// them.
func (o Outbox) Names() string {
	var names []string
	for _, t := range o.Tables {
		names = append(names, t.qualified())
	}
	return strings.Join(names, ", ")
}

// EnsurePublication creates the publication for the outbox tables with
// publish = 'insert' and publish_via_partition_root = true unless it
// exists. To an existing publication, it adds the outbox tables it lacks
// (added lists them): a row written to such a table before it was added is
// not published. An existing publication must then pass CheckPublication.
func EnsurePublication(ctx context.Context, conn *pgx.Conn, o Outbox) (created bool, added []string, err error) {
	if !ValidPublicationName(o.Publication) {
		return false, nil, fmt.Errorf("publication name %q: want 1 to 63 bytes of UTF-8 without a control character", o.Publication)
	}
	if len(o.Tables) == 0 {
		return false, nil, errors.New("publication " + o.Publication + ": no outbox table")
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", o.Publication).Scan(&exists); err != nil {
		return false, nil, fmt.Errorf("look up publication %s: %w", o.Publication, err)
	}
	if !exists {
		var list []string
		for _, t := range o.Tables {
			if err := CheckTableOwner(ctx, conn, t.Schema, t.Name); err != nil {
				return false, nil, fmt.Errorf("create publication %s: %w", o.Publication, err)
			}
			list = append(list, t.sanitized())
		}
		// Via the root: a partitioned outbox's rows then come as the
		// root's, whatever partition they went to, attached later too.
		sql := "CREATE PUBLICATION " + pgx.Identifier{o.Publication}.Sanitize() + " FOR TABLE " + strings.Join(list, ", ") +
			" WITH (publish = 'insert', publish_via_partition_root = true)"
		_, err = conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			return EnsurePublication(ctx, conn, o)
		}
		if err != nil {
			return false, nil, fmt.Errorf("create publication %s for %s: %w", o.Publication, o.Names(), err)
		}
		return true, nil, nil
	}
	missing, err := missingTables(ctx, conn, o)
	if err != nil {
		return false, nil, err
	}
	for _, t := range missing {
		if err := CheckTableOwner(ctx, conn, t.Schema, t.Name); err != nil {
			return false, added, fmt.Errorf("add %s to publication %s: %w", t.qualified(), o.Publication, err)
		}
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pgx.Identifier{o.Publication}.Sanitize()+" ADD TABLE "+t.sanitized()); err != nil {
			return false, added, fmt.Errorf("add %s to publication %s: %w", t.qualified(), o.Publication, err)
		}
		added = append(added, t.Schema+"."+t.Name)
	}
	problems, err := CheckPublication(ctx, conn, o)
	if err != nil {
		return false, added, err
	}
	if len(problems) > 0 {
		return false, added, fmt.Errorf("publication %s: %s", o.Publication, strings.Join(problems, "; "))
	}
	return false, added, nil
}

// missingTables lists the outbox tables an existing publication of some
// tables does not publish; none when it publishes every table or a schema
// (CheckPublication refuses those).
func missingTables(ctx context.Context, conn *pgx.Conn, o Outbox) ([]Table, error) {
	var missing []Table
	for _, t := range o.Tables {
		var covered bool
		err := conn.QueryRow(ctx, `SELECT p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid)
			OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = to_regclass($2))
			FROM pg_publication p WHERE p.pubname = $1`, o.Publication, t.sanitized()).Scan(&covered)
		if err != nil {
			return nil, fmt.Errorf("read tables of publication %s: %w", o.Publication, err)
		}
		if !covered {
			missing = append(missing, t)
		}
	}
	return missing, nil
}

// CheckPublication lists what in an existing publication could let a row of
// an outbox table pass unpublished, each with the statement that fixes it:
// it does not publish inserts, publishes other tables (FOR ALL TABLES, a
// schema, a table added by hand: their Relation messages would stop the
// stream), does not cover an outbox table, publishes a partitioned outbox
// under its partitions' names, filters rows (unless AllowRowFilter), or
// leaves out a column walrelay reads.
func CheckPublication(ctx context.Context, conn *pgx.Conn, o Outbox) ([]string, error) {
	p, err := Publication(ctx, conn, o.Publication)
	if err != nil {
		return nil, err
	}
	name := ident(o.Publication)
	var problems []string
	if !slices.Contains(p.Publish, "insert") {
		ops := strings.Join(append(slices.Clone(p.Publish), "insert"), ", ")
		problems = append(problems, fmt.Sprintf("it does not publish inserts: ALTER PUBLICATION %s SET (publish = '%s')", name, ops))
	}
	if p.AllTables {
		problems = append(problems, "it publishes every table (FOR ALL TABLES): give walrelay a publication of the outbox alone (walrelay publication create NAME, then postgres.publication)")
	}
	var schemas []string
	rows, err := conn.Query(ctx, "SELECT n.nspname::text FROM pg_publication_namespace pn JOIN pg_namespace n ON n.oid = pn.pnnspid JOIN pg_publication p ON p.oid = pn.pnpubid WHERE p.pubname = $1 ORDER BY 1", o.Publication)
	if err == nil {
		schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, fmt.Errorf("read schemas of publication %s: %w", o.Publication, err)
	}
	if len(schemas) > 0 {
		problems = append(problems, fmt.Sprintf("it publishes every table of schema %s: give walrelay a publication of the outbox alone (walrelay publication create NAME, then postgres.publication)", strings.Join(schemas, ", ")))
	}
	// The oid of each outbox table: a member is an outbox table by its oid.
	oids := make([]uint32, len(o.Tables))
	for i, t := range o.Tables {
		var oid *uint32
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1)::oid", t.sanitized()).Scan(&oid); err != nil {
			return nil, fmt.Errorf("read the oid of %s: %w", t.qualified(), err)
		}
		if oid != nil {
			oids[i] = *oid
		}
	}
	type member struct {
		rel      string
		oid      uint32
		filter   bool
		colsKept []string // nil: every column
	}
	rows, err = conn.Query(ctx, `SELECT r.prrelid::regclass::text, r.prrelid::oid, r.prqual IS NOT NULL,
		CASE WHEN r.prattrs IS NULL THEN NULL ELSE (SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = r.prrelid AND a.attnum = ANY (r.prattrs)) END
		FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = $1 ORDER BY 1`, o.Publication)
	if err != nil {
		return nil, fmt.Errorf("read tables of publication %s: %w", o.Publication, err)
	}
	var members []member
	var m member
	if _, err := pgx.ForEachRow(rows, []any{&m.rel, &m.oid, &m.filter, &m.colsKept}, func() error {
		members = append(members, m)
		m.colsKept = nil
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read tables of publication %s: %w", o.Publication, err)
	}
	covered := make([]bool, len(o.Tables))
	for _, m := range members {
		i := slices.Index(oids, m.oid)
		if i < 0 || m.oid == 0 {
			problems = append(problems, fmt.Sprintf("it publishes %s, which is not an outbox table: ALTER PUBLICATION %s DROP TABLE %s", m.rel, name, m.rel))
			continue
		}
		covered[i] = true
		t := o.Tables[i]
		if m.filter && !o.AllowRowFilter {
			problems = append(problems, fmt.Sprintf("it filters the rows of %s (a row filter): the rows it leaves out are never published. "+
				"For a shard of a sharded outbox set postgres.allow_row_filter=true; otherwise ALTER PUBLICATION %s SET TABLE %s", t.qualified(), name, o.Names()))
		}
		if m.colsKept != nil {
			var missing []string
			for _, c := range t.Columns {
				if !slices.Contains(m.colsKept, c) {
					missing = append(missing, c)
				}
			}
			if len(missing) > 0 {
				problems = append(problems, fmt.Sprintf("its column list of %s leaves out %s, which walrelay reads: ALTER PUBLICATION %s SET TABLE %s", t.qualified(), strings.Join(missing, ", "), name, o.Names()))
			}
		}
	}
	for i, t := range o.Tables {
		if !covered[i] && !p.AllTables && len(schemas) == 0 {
			problems = append(problems, fmt.Sprintf("it does not publish the outbox %s.%s: ALTER PUBLICATION %s ADD TABLE %s "+
				"(the rows already written to it are not in the stream, then or later: walrelay reconcile --table %s --all --replay --yes republishes those missing from the topic)",
				t.Schema, t.Name, name, t.qualified(), shellquote.Arg(t.Schema+"."+t.Name)))
		}
		var partitioned bool
		if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)", t.sanitized()).Scan(&partitioned); err != nil {
			return nil, fmt.Errorf("read the kind of %s: %w", t.qualified(), err)
		}
		if partitioned && !p.ViaRoot {
			problems = append(problems, fmt.Sprintf("the outbox %s is partitioned and the publication sends its rows under each partition's name: ALTER PUBLICATION %s SET (publish_via_partition_root = true)", t.qualified(), name))
		}
		unlogged, err := UnloggedPartitions(ctx, conn, t.Schema, t.Name)
		if err != nil {
			return nil, err
		}
		problems = append(problems, unlogged...)
	}
	return problems, nil
}

// UnloggedPartitions lists, each with the statement that fixes it, the
// partitions of the outbox that are UNLOGGED: their rows are never written
// to the WAL, so never published. PostgreSQL refuses an unlogged table in a
// publication, but not an unlogged partition of a published partitioned
// table (created so, attached, or set so later).
func UnloggedPartitions(ctx context.Context, conn *pgx.Conn, schema, table string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT t.relid::regclass::text FROM pg_partition_tree(to_regclass($1)) t
		JOIN pg_class c ON c.oid = t.relid WHERE c.relpersistence = 'u' ORDER BY 1`, pgx.Identifier{schema, table}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s.%s: %w", schema, table, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s.%s: %w", schema, table, err)
	}
	var problems []string
	for _, n := range names {
		problems = append(problems, fmt.Sprintf("partition %s of the outbox is UNLOGGED: its rows are not written to the WAL, so never published: ALTER TABLE %s SET LOGGED", n, n))
	}
	return problems, nil
}

// PublicationInfo is a publication and what it covers.
type PublicationInfo struct {
	Name      string   `json:"name"`
	AllTables bool     `json:"all_tables"`
	ViaRoot   bool     `json:"publish_via_partition_root"`
	Publish   []string `json:"publish"` // insert, update, delete, truncate
	Tables    []string `json:"tables"`  // schema.table
}

// ErrPublicationMissing is wrapped when the publication does not exist.
var ErrPublicationMissing = errors.New("publication does not exist")

// Publication describes the publication name.
func Publication(ctx context.Context, conn *pgx.Conn, name string) (PublicationInfo, error) {
	p := PublicationInfo{Name: name, Tables: []string{}}
	var ins, upd, del, trunc bool
	err := conn.QueryRow(ctx, "SELECT puballtables, pubviaroot, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1", name).
		Scan(&p.AllTables, &p.ViaRoot, &ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("publication %s: %w", name, ErrPublicationMissing)
	}
	if err != nil {
		return p, fmt.Errorf("read publication %s: %w", name, err)
	}
	for _, x := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if x.on {
			p.Publish = append(p.Publish, x.name)
		}
	}
	rows, err := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1", name)
	if err != nil {
		return p, fmt.Errorf("read tables of publication %s: %w", name, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return p, fmt.Errorf("read tables of publication %s: %w", name, err)
	}
	p.Tables = append(p.Tables, tables...)
	return p, nil
}

// CheckTableOwner returns an error naming the missing privilege when the
// current role may not add schema.table to a publication (it must own the
// table, or be a member of its owner, or be superuser).
func CheckTableOwner(ctx context.Context, conn *pgx.Conn, schema, table string) error {
	var owner, me string
	var ok bool
	err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(c.relowner), current_user,
		pg_has_role(current_user, c.relowner, 'USAGE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
		FROM pg_class c WHERE c.oid = to_regclass($1)`, pgx.Identifier{schema, table}.Sanitize()).Scan(&owner, &me, &ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("table %s.%s does not exist", schema, table)
	}
	if err != nil {
		return fmt.Errorf("read owner of %s.%s: %w", schema, table, err)
	}
	if !ok {
		return fmt.Errorf("role %s does not own table %s.%s (its owner is %s): a publication needs the table's owner; run it as %s, or GRANT %s TO %s",
			me, schema, table, owner, owner, owner, me)
	}
	return nil
}

// DropPublication drops the publication and returns what it published;
// with dryRun it checks and reports without dropping.
func DropPublication(ctx context.Context, conn *pgx.Conn, name string, dryRun bool) (PublicationInfo, error) {
	p, err := Publication(ctx, conn, name)
	if err != nil || dryRun {
		return p, err
	}
	if _, err := conn.Exec(ctx, "DROP PUBLICATION "+pgx.Identifier{name}.Sanitize()); err != nil {
		return p, fmt.Errorf("drop publication %s: %w", name, err)
	}
	return p, nil
}

// Membership is how a publication published the outbox tables at one
// moment, as WatchPublication read it: the publication's oid and its row's
// xmin (the transaction that last wrote it) and, per outbox table, whether
// it existed, the oid of its pg_publication_rel row and that of the
// pg_publication_namespace row of its schema (0 when none). The zero
// Membership is "not read yet".
type Membership struct {
	pub, xmin uint32
	exists    []bool
	rels      []uint32
	nsps      []uint32
}

// WatchPublication reads how publication pub publishes the outbox tables
// now and lists, against prev (the previous reading, or the zero
// Membership), every change under a running stream that lets rows of an
// outbox table pass unpublished: pgoutput decodes each transaction with the
// publication as of its commit, so a row written while its table is out of
// the publication, or while the publication does not publish inserts, is
// passed over without an error (and on PostgreSQL 18 without an error even
// when the publication itself is gone), then and on every later decode. It
// names: the publication gone, or dropped and created again; inserts no
// longer published; an outbox table no longer published; an outbox table
// taken out and put back between two readings, which leaves a new
// pg_publication_rel row (a SET TABLE that changes its row filter or
// column list makes a new row too) or a new pg_publication_namespace row
// (DROP and ADD TABLES IN SCHEMA), unless another of the ways that covered
// it (its own row, its schema's) stayed the same row throughout; and the
// publication's own row rewritten (its xmin changed), since
// SET (publish = ...) turned off and on again between two readings leaves
// nothing else to see.
//
// That last one cannot be told from a harmless rewrite of the same row
// (ALTER PUBLICATION ... OWNER TO, RENAME, SET (publish = ...) re-applied
// with the same value, SET (publish_via_partition_root = ...)): the row's
// earlier versions are not readable. It is named as a possible loss, the
// caller stops and gives the reconcile of the window, which finds nothing
// missing when nothing was. ADD, DROP and SET TABLE leave the publication's
// row as it is. An outbox table that no longer exists is not named, nor
// one that did not exist at the previous reading.
func WatchPublication(ctx context.Context, conn *pgx.Conn, pub string, tables []Table, prev Membership) (Membership, []string, error) {
	var now Membership
	var insert, all bool
	err := conn.QueryRow(ctx, "SELECT oid, xmin::text::bigint, pubinsert, puballtables FROM pg_publication WHERE pubname = $1", pub).Scan(&now.pub, &now.xmin, &insert, &all)
	if errors.Is(err, pgx.ErrNoRows) {
		return now, []string{fmt.Sprintf("publication %s was dropped", pub)}, nil
	}
	if err != nil {
		return prev, nil, fmt.Errorf("read publication %s: %w", pub, err)
	}
	var problems []string
	same := prev.pub != 0 && prev.pub == now.pub
	if prev.pub != 0 && prev.pub != now.pub {
		problems = append(problems, fmt.Sprintf("publication %s was dropped and created again", pub))
	}
	if !insert {
		problems = append(problems, fmt.Sprintf("publication %s no longer publishes inserts (ALTER PUBLICATION ... SET (publish = ...))", pub))
	} else if same && prev.xmin != now.xmin {
		problems = append(problems, fmt.Sprintf("publication %s's row was rewritten since the last check (ALTER PUBLICATION ... SET (publish = ...), OWNER TO, RENAME): "+
			"if publish was turned off and on again in between, the rows written meanwhile were passed over, and walrelay cannot tell whether it was", pub))
	}
	now.exists = make([]bool, len(tables))
	now.rels = make([]uint32, len(tables))
	now.nsps = make([]uint32, len(tables))
	comparable := same && len(prev.rels) == len(tables) && len(prev.nsps) == len(tables) && len(prev.exists) == len(tables)
	for i, t := range tables {
		var exists bool
		var rel, nsp *uint32
		err := conn.QueryRow(ctx, `SELECT to_regclass($2) IS NOT NULL,
			(SELECT r.oid FROM pg_publication_rel r WHERE r.prpubid = $1 AND r.prrelid = to_regclass($2)),
			(SELECT pn.oid FROM pg_publication_namespace pn JOIN pg_class c ON c.relnamespace = pn.pnnspid WHERE pn.pnpubid = $1 AND c.oid = to_regclass($2))`,
			now.pub, t.sanitized()).Scan(&exists, &rel, &nsp)
		if err != nil {
			return prev, nil, fmt.Errorf("read how publication %s publishes %s: %w", pub, t.qualified(), err)
		}
		if !exists {
			continue
		}
		now.exists[i] = true
		if rel != nil {
			now.rels[i] = *rel
		}
		if nsp != nil {
			now.nsps[i] = *nsp
		}
		kept := func(was, is uint32) bool { return was != 0 && was == is }
		switch {
		case all:
			// FOR ALL TABLES covers every table, and cannot be altered.
		case rel == nil && nsp == nil:
			problems = append(problems, fmt.Sprintf("the outbox %s.%s was removed from publication %s (ALTER PUBLICATION ... DROP TABLE or DROP TABLES IN SCHEMA, or SET without it)", t.Schema, t.Name, pub))
		case comparable && prev.exists[i] && !kept(prev.rels[i], now.rels[i]) && !kept(prev.nsps[i], now.nsps[i]):
			problems = append(problems, fmt.Sprintf("the outbox %s.%s was removed from publication %s and added again (DROP and ADD TABLE, DROP and ADD TABLES IN SCHEMA, or its row filter or column list changed) since the last check", t.Schema, t.Name, pub))
		}
	}
	return now, problems, nil
}
