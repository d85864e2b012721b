package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/shellquote"
)

// ErrPublicationAfterSlot is wrapped when a slot's position is before the
// creation of the publication walrelay would read it with: pgoutput looks
// the publication up in the catalog as of each decoded transaction, so
// every transaction between the slot's position and the publication's
// creation fails with `publication "…" does not exist` (PostgreSQL up to
// 17; 18 skips the publication with a WARNING, and the rows with it).
var ErrPublicationAfterSlot = errors.New("the slot's position is before the publication was created")

// PublicationGap says whether the logical slot's confirmed position is
// before the creation of publication pub, so that decoding the slot with
// pub fails (or, on PostgreSQL 18, skips what it cannot see). A missing
// slot or publication is no gap (other checks name them).
//
// The catalog keeps no creation LSN of a publication, so the answer comes
// in two steps. First the publication row's xmin (the transaction that
// created it) against the slot's catalog_xmin: a transaction older than
// catalog_xmin had ended before the slot's restart point, so every
// snapshot the slot decodes with sees the publication: no gap, for sure,
// at the cost of one query. Otherwise (a publication created after the
// slot's restart point: rare outside the trap, and the slot may still have
// confirmed past it) PostgreSQL itself decides: a temporary copy of the
// slot (pg_copy_logical_replication_slot, same restart and confirmed
// positions) is decoded with pub up to the current WAL end
// (pg_logical_slot_peek_binary_changes, which moves nothing) and dropped.
// That decodes what walrelay's stream would, so it costs the slot's lag in
// WAL read; a copy needs a free slot of max_replication_slots. When the
// copy cannot be made, err says why and behind is the first step's
// "maybe".
func PublicationGap(ctx context.Context, conn *pgx.Conn, slot, pub string) (behind bool, err error) {
	var suspect bool
	err = conn.QueryRow(ctx, `SELECT age(p.xmin) BETWEEN 0 AND age(s.catalog_xmin)
		FROM pg_replication_slots s, pg_publication p
		WHERE s.slot_name = $1 AND s.slot_type = 'logical' AND s.catalog_xmin IS NOT NULL AND s.database = current_database() AND p.pubname = $2`, slot, pub).Scan(&suspect)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("compare slot %s with publication %s: %w", slot, pub, err)
	}
	if !suspect {
		return false, nil
	}
	// A copy of the slot, decoded with the publication, on a session of
	// its own: the copy is temporary, dropped with that session whatever
	// happens, and the session's notices are read (PostgreSQL 18:
	// WARNING: skipped loading publication "…").
	var skipped bool
	ccfg := conn.Config()
	ReceiveWarnings(ccfg.RuntimeParams)
	ccfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if isPublicationSkipped(n.Code, n.Message, pub) {
			skipped = true
		}
	}
	peek, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		return true, fmt.Errorf("connect to tell whether slot %s's position is before publication %s was created: %w", slot, pub, err)
	}
	defer peek.Close(context.WithoutCancel(ctx))
	copyName := fmt.Sprintf("walrelay_gap_%d", peek.PgConn().PID())
	if _, err := peek.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2, true)", slot, copyName); err != nil {
		return true, fmt.Errorf("copy slot %s to tell whether its position is before publication %s was created: %w", slot, pub, err)
	}
	// Dropped before the session ends, too: a session's temporary slot
	// goes only as its server process exits, after Close returns.
	defer func() { _, _ = peek.Exec(context.WithoutCancel(ctx), "SELECT pg_drop_replication_slot($1)", copyName) }()
	var n int64
	err = peek.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, pg_current_wal_lsn(), NULL,
		'proto_version', '1', 'publication_names', $2)`, copyName, pgx.Identifier{pub}.Sanitize()).Scan(&n)
	if isPublicationMissing(err, pub) {
		return true, nil
	}
	if err != nil {
		return true, fmt.Errorf("decode a copy of slot %s with publication %s: %w", slot, pub, err)
	}
	return skipped, nil
}

// PublicationGapError is the error of a slot whose position is before its
// publication's creation (it wraps ErrPublicationAfterSlot): the cause in
// one sentence, then the ways out.
func PublicationGapError(slot, pub string) error { return &gapError{slot, pub} }

type gapError struct{ slot, pub string }

func (e *gapError) Is(target error) bool { return target == ErrPublicationAfterSlot }

func (e *gapError) Error() string {
	return fmt.Sprintf("slot %s's position is before publication %s was created, and PostgreSQL decodes each transaction with the publications that existed when it committed, "+
		"so walrelay cannot stream the slot with %s until the slot has passed that point. "+
		"If the slot's former reader (Debezium) can still run, run it until walrelay check says OK for the slot, then stop it and start walrelay: nothing is lost. "+
		"Otherwise walrelay slot resync --yes moves the slot to the current end of the WAL and republishes from the outbox table every row missing from its topic "+
		"(rows your application deleted from the table in between cannot be recovered that way; docs/debezium.md)", e.slot, e.pub, e.pub)
}

// ErrPublicationBehindSlot is wrapped when walrelay refuses to create a
// publication that an existing slot's position is before.
var ErrPublicationBehindSlot = errors.New("the publication would be created after the slot's position")

// NewPublicationBehindSlot is asked before creating publication pub for
// slot: when pub exists or slot does not, there is nothing to say. When the
// slot exists, a publication created now is after its position, and the
// slot can be streamed with it only once its position has passed now (and
// then only if no transaction decoded in between: PublicationGap tells).
// A slot in use (allowActive: its reader, Debezium during a switch-over,
// confirms past now as it goes on) is the right order: note says what to
// wait for. A slot no one reads is refused (err wraps
// ErrPublicationBehindSlot) with the ways out, and so is any slot when
// !allowActive (walrelay run never creates a publication behind a slot).
func NewPublicationBehindSlot(ctx context.Context, conn *pgx.Conn, pub, slot string, allowActive bool) (note string, err error) {
	var active bool
	var pid *int
	err = conn.QueryRow(ctx, `SELECT s.active, s.active_pid FROM pg_replication_slots s
		WHERE s.slot_name = $1 AND s.slot_type = 'logical' AND s.database = current_database()
		AND NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)`, slot, pub).Scan(&active, &pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up slot %s and publication %s: %w", slot, pub, err)
	}
	if active && allowActive {
		return fmt.Sprintf("slot %s is in use (server process %d) and its position is before publication %s, created now: walrelay can stream the slot once its reader has confirmed past now; "+
			"keep that reader (Debezium) running until walrelay check says OK for the slot, then stop it and start walrelay", slot, deref(pid), pub), nil
	}
	return "", &behindError{slot, pub}
}

// publicationVanished explains the server's `publication "…" does not
// exist` in the stream: either the publication is gone, or (it exists
// again, or was created late) the slot's position is before its creation.
// It returns nil for any other error.
func publicationVanished(err error, pub string) error {
	if !isPublicationMissing(err, pub) {
		return nil
	}
	return fmt.Errorf("%w (either publication %s was dropped, or it was created, or created again, after the slot's position: walrelay check tells which and gives the way out)", err, pub)
}

type behindError struct{ slot, pub string }

func (e *behindError) Is(target error) bool { return target == ErrPublicationBehindSlot }

func (e *behindError) Error() string {
	return fmt.Sprintf("publication %s does not exist, and slot %s does: created now, the publication would be after the slot's position, and walrelay could not stream the slot with it until the slot has passed that point, so walrelay does not create it. "+
		"If the slot's reader (Debezium) can still run: start it, run walrelay publication create while it runs, and stop it when walrelay check says OK for the slot (nothing lost). "+
		"Otherwise walrelay slot resync --yes creates the publication, moves the slot to the current end of the WAL and republishes from the outbox table every row missing from its topic "+
		"(rows deleted from the table in between cannot be recovered that way; docs/debezium.md)", e.pub, e.slot)
}

// isPublicationSkipped says whether a notice (its SQLSTATE and message) is
// PostgreSQL 18's WARNING `skipped loading publication "pub"`. The text is
// translated into the server's lc_messages, so it is recognized by its
// SQLSTATE, 55000 (object_not_in_prerequisite_state), and pub's name
// standing alone in the message (between quotes of any language: "…",
// »…«, „…“, 「…」).
func isPublicationSkipped(code, message, pub string) bool {
	return code == "55000" && namesAlone(message, pub)
}

// isPublicationMissing recognises the server's error that publication pub
// does not exist (42704) by its SQLSTATE and the name standing alone in
// it, in any language the server's messages are in (lc_messages): not by
// the word "publication".
func isPublicationMissing(err error, pub string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42704" && namesAlone(pgErr.Message, pub)
}

// namesAlone says whether message holds name not as part of a longer
// name (between quotes of any language, or spaces).
func namesAlone(message, name string) bool {
	if name == "" {
		return false
	}
	for rest, off := message, 0; ; {
		i := strings.Index(rest, name)
		if i < 0 {
			return false
		}
		start, end := off+i, off+i+len(name)
		before, _ := utf8.DecodeLastRuneInString(message[:start])
		after, _ := utf8.DecodeRuneInString(message[end:])
		if !identRune(before) && !identRune(after) {
			return true
		}
		off = start + 1
		rest = message[off:]
	}
}

// identRune says whether r can be part of an unquoted SQL identifier, so
// that a name next to it is part of a longer name.
func identRune(r rune) bool {
	return r == '_' || r == '$' || unicode.IsLetter(r) || unicode.IsDigit(r)
}

// publicationSkipped is the error of PostgreSQL 18's WARNING `skipped
// loading publication "…"` in the stream: the server could not see the
// publication as of a transaction and would pass that transaction's rows
// over, so walrelay stops before confirming them.
func publicationSkipped(warning, pub string) error {
	return fmt.Errorf("%s: publication %s was dropped, or created (or created again) after the slot's position; "+
		"walrelay stops rather than let the rows of that transaction pass unpublished: walrelay check tells which and gives the way out", warning, pub)
}

// TablesAddedAfterSlot lists (schema.table) the tables of publication pub
// that were added to it (CREATE PUBLICATION ... FOR TABLE, ALTER
// PUBLICATION ... ADD TABLE) after the logical slot's position may be:
// pgoutput decodes each transaction with the publication's tables as of its
// commit, so a row written to such a table between the slot's position and
// the ALTER is passed over, on every PostgreSQL version, with no error and
// no WARNING. Only the table can give those rows back (walrelay reconcile
// --table T --all --replay --yes).
//
// The test is that of PublicationGap's first step, per table: the
// pg_publication_rel row's xmin (the transaction that added the table)
// against the slot's catalog_xmin. A table added before the slot's restart
// point is none, for sure. One added after it is listed even when the slot
// has since confirmed past the ALTER (a slot no one read since, or
// between two of its reader's standby updates): the decode of a copy cannot
// tell, since the rows passed over leave no trace in the stream. Each table
// is judged by its own pg_publication_rel row, whatever the publication's
// row: that row is rewritten by any ALTER PUBLICATION (SET (publish = ...)
// re-applied, OWNER TO, RENAME), which says nothing of the tables. A
// publication created after the slot's position lists its tables too: the
// callers let PublicationGap's refusal take precedence when its copy test
// says the publication itself is behind the slot. A missing slot or
// publication lists nothing. A negative age() is a row older than 2^31
// transactions (age is a 32-bit circular difference and freezing keeps the
// raw xmin): old, not late; the same holds in PublicationGap's first step.
func TablesAddedAfterSlot(ctx context.Context, conn *pgx.Conn, slot, pub string) ([]string, error) {
	rows, err := conn.Query(ctx, `SELECT n.nspname || '.' || c.relname
		FROM pg_replication_slots s, pg_publication p
		JOIN pg_publication_rel r ON r.prpubid = p.oid
		JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE s.slot_name = $1 AND s.slot_type = 'logical' AND s.catalog_xmin IS NOT NULL AND s.database = current_database() AND p.pubname = $2
		AND age(r.xmin) BETWEEN 0 AND age(s.catalog_xmin)
		ORDER BY 1`, slot, pub)
	var tables []string
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, fmt.Errorf("compare slot %s with the tables of publication %s: %w", slot, pub, err)
	}
	return tables, nil
}

// TablesAddedAfterSlotError says that tables were added to publication pub
// after slot's position, and the way out.
func TablesAddedAfterSlotError(slot, pub string, tables []string) string {
	var cmds []string
	for _, t := range tables {
		cmds = append(cmds, "walrelay reconcile --table "+shellquote.Arg(t)+" --all --replay --yes")
	}
	return fmt.Sprintf("%s added to publication %s after slot %s's position, or near it: the rows written to it between the slot's position and the ALTER PUBLICATION are passed over by the stream, without an error. "+
		"Only the table has them: %s republishes those missing from the topic (--since TIME instead of --all bounds the window to the rows written since TIME)",
		strings.Join(tables, ", ")+map[bool]string{true: " was", false: " were"}[len(tables) == 1], pub, slot, strings.Join(cmds, "; "))
}
