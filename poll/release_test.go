package poll

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/sink"

	"time"
)

// TestReleaseBounded (review of issue 36 item 6): the release before each
// claim sets back at most parkBatches batches of rows, whatever the number
// of aggregates unblocked at once (on_dead switched from block to skip
// here, 2,000 aggregates with 5 parked rows each), and the next releases
// go on with the aggregates left, until each has its first batch back.
func TestReleaseBounded(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: DeadBlock})
	ctx := t.Context()
	const aggs, behind = 2000, 5
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status)
		SELECT gen_random_uuid(), 'order', 'a-' || g, 'T', '{}', CASE WHEN n = 0 THEN 'DEAD' ELSE 'PARKED' END
		FROM generate_series(1, $1::int) g, generate_series(0, $2::int) n ORDER BY n, g`, aggs, behind); err != nil {
		t.Fatal(err)
	}
	if n := release(t, conn, tb); n != 0 {
		t.Fatalf("released %d rows behind DEAD rows under on_dead block", n)
	}
	// The operator switches on_dead to skip.
	skip := newTable(tb.rt, Config{Ordering: OrderAggregate, OnDead: DeadSkip, BatchSize: tb.batch, MaxBatchBytes: int(tb.maxBytes), MaxEventBytes: tb.maxEvent, Lease: 30e9})
	limit := int64(parkBatches * tb.batch)
	total := int64(0)
	for i := 0; ; i++ {
		start := time.Now()
		n := release(t, conn, skip)
		if n > limit {
			t.Fatalf("release %d set %d rows back to PENDING in %s, more than the %d a claim may park: a release is bounded by nothing (every aggregate unblocked at once times a batch), under the round's 30 s timeout",
				i, n, time.Since(start).Round(time.Millisecond), limit)
		}
		total += n
		if n == 0 || i > 20 {
			break
		}
	}
	// Each aggregate's parked rows (5, under a batch) back, in all.
	if total != aggs*behind {
		t.Fatalf("the releases set back %d rows in all, want %d (every aggregate's parked rows)", total, aggs*behind)
	}
}

// TestClaimDespiteFailedRelease (review of issue 36 item 6): a release
// that fails (here a trigger refuses it) is logged and counted, and the
// claim runs all the same: a release that keeps failing must not stop
// every claim.
func TestClaimDespiteFailedRelease(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: DeadSkip})
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE FUNCTION refuse_release() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF OLD.status = 'PARKED' AND NEW.status = 'PENDING' THEN RAISE EXCEPTION 'release refused'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_release BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_release()`); err != nil {
		t.Fatal(err)
	}
	// One aggregate whose parked row is releasable, one due row of another.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status) VALUES
		(gen_random_uuid(), 'order', 'parked', 'T', '{}', 'PARKED')`); err != nil {
		t.Fatal(err)
	}
	insertMany(t, conn, "due", 1)
	cc, _ := pgx.ParseConfig("postgres://u@127.0.0.1:1/db")
	var failed []error
	p, err := New(Config{ConnConfig: cc, Ordering: OrderAggregate, Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}},
		PollHooks: Hooks{Released: func(table string, rows int64, err error) {
			if err != nil {
				failed = append(failed, err)
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	rs, _, err := p.claimTable(ctx, conn, tb, "w:1")
	if err != nil {
		t.Fatalf("a claim after a failed release: %v, want the due row claimed all the same", err)
	}
	if len(rs) != 1 || rs[0].e.AggregateID != "due" {
		t.Fatalf("claimed %d rows, want the due row", len(rs))
	}
	if len(failed) != 1 {
		t.Fatalf("release failures counted: %v, want 1", failed)
	}
}

// TestCheckTableWantsParkedPartition (review of issue 36 item 6): an
// outbox partitioned by LIST (status) with no partition for PARKED rows
// (every claim that parks a row would fail) is refused, naming it; a
// partition for them (or a DEFAULT one) satisfies the check.
func TestCheckTableWantsParkedPartition(t *testing.T) {
	t.Parallel()
	conn := serverConn(t)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, payload jsonb, status text NOT NULL DEFAULT 'PENDING') PARTITION BY LIST (status);
		CREATE TABLE outbox_unsent PARTITION OF outbox FOR VALUES IN ('PENDING', 'SENDING');
		CREATE TABLE outbox_done PARTITION OF outbox FOR VALUES IN ('SENT', 'DEAD')`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	l := decoder.Config{}.WithDefaults().Layouts()[0]
	if err := CheckTable(ctx, conn, l); err == nil || !strings.Contains(err.Error(), "a partition for status PARKED") {
		t.Fatalf("CheckTable of an outbox partitioned by status without a partition for PARKED: %v, want it named", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox_parked PARTITION OF outbox FOR VALUES IN ('PARKED')`); err != nil {
		t.Fatal(err)
	}
	if err := CheckTable(ctx, conn, l); err != nil {
		t.Fatalf("CheckTable with a partition for PARKED: %v", err)
	}
}

// TestMarkReleasesParkedRows (review of issue 36 item 6): the mark that
// sends the row that blocked an aggregate releases the rows parked behind
// it at once (in order, by the claims that follow), so that the sweep of
// every aggregate with parked rows, which walks every blocked aggregate,
// runs only once per sweepEvery, not before every claim.
func TestMarkReleasesParkedRows(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: DeadSkip})
	ctx := t.Context()
	ids := map[string]string{}
	insert(t, conn, ids, "a", "a", "a", "b")
	set(t, conn, ids["a-0"], "available_at = now() + interval '1 hour', attempts = 1")
	cc, _ := pgx.ParseConfig("postgres://u@127.0.0.1:1/db")
	sweeps := 0
	p, err := New(Config{ConnConfig: cc, Ordering: OrderAggregate, Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}},
		PollHooks: Hooks{Released: func(string, int64, error) { sweeps++ }}})
	if err != nil {
		t.Fatal(err)
	}
	rs, _, err := p.claimTable(ctx, conn, tb, "w:1")
	if err != nil || len(rs) != 1 || rs[0].e.AggregateID != "b" {
		t.Fatalf("first claim: %d rows, %v; want b-0", len(rs), err)
	}
	if got, want := statuses(t, conn, ids, "a-1", "a-2"), []string{"PARKED", "PARKED"}; !slices.Equal(got, want) {
		t.Fatalf("rows behind a-0 in backoff: %v, want %v", got, want)
	}
	set(t, conn, ids["a-0"], "available_at = now()")
	rs, _, err = p.claimTable(ctx, conn, tb, "w:2")
	if err != nil || len(rs) != 1 || rs[0].id != ids["a-0"] {
		t.Fatalf("second claim: %d rows, %v; want a-0", len(rs), err)
	}
	if sweeps != 1 {
		t.Fatalf("%d sweeps of the parked rows for two claims within %s, want 1", sweeps, sweepEvery)
	}
	c := &claimed{t: tb, claim: "w:2", rows: rs, m: &marks{}}
	c.m.add(ids["a-0"], "SENT", 0, 0, "")
	if err := p.mark(ctx, conn, c); err != nil {
		t.Fatal(err)
	}
	if got, want := statuses(t, conn, ids, "a-0", "a-1", "a-2"), []string{"SENT", "PENDING", "PENDING"}; !slices.Equal(got, want) {
		t.Fatalf("after the mark that sent a-0: %v, want %v (the rows parked behind it released by the mark)", got, want)
	}
	rs, _, err = p.claimTable(ctx, conn, tb, "w:3")
	if err != nil || len(rs) != 2 || rs[0].id != ids["a-1"] || rs[1].id != ids["a-2"] {
		t.Fatalf("third claim: %d rows, %v; want a-1, a-2 in order", len(rs), err)
	}
}
