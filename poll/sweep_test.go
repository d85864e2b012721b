package poll

import (
	"os"
	"testing"
	"time"
)

// TestSweepVisitsBoundedAggregates: a sweep visits at most sweepAggs
// aggregates with parked rows (BatchSize 100: 1,000), from after the last
// one the previous sweep visited, and wraps around: 2,500 blocked
// aggregates (a row in back-off, one parked behind it) and one free one
// after them take
// three sweeps to reach the free one, which the third releases; the fourth
// starts from the first again.
func TestSweepVisitsBoundedAggregates(t *testing.T) {
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, BatchSize: 100})
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, available_at, attempts)
		SELECT gen_random_uuid(), 'order', 'b-' || lpad(i::text, 4, '0'), 'T', '{}', now() + interval '1 hour', 3 FROM generate_series(0, 2499) i;
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status)
		SELECT gen_random_uuid(), 'order', 'b-' || lpad(i::text, 4, '0'), 'T', '{}', 'PARKED' FROM generate_series(0, 2499) i;
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status) VALUES (gen_random_uuid(), 'order', 'z', 'T', '{}', 'PARKED')`); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		released int64
		cursor   string // "" for none
	}{{0, "b-0999"}, {0, "b-1999"}, {1, ""}, {0, "b-0999"}} {
		n, err := tb.sweep(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		cursor := ""
		if tb.cursor != nil {
			cursor = *tb.cursor
		}
		if n != want.released || cursor != want.cursor {
			t.Fatalf("sweep %d released %d rows and stopped after %q; want %d, %q", i+1, n, cursor, want.released, want.cursor)
		}
	}
}

// TestSweepTimeBounded (long): a sweep that releases nothing with 100,010
// blocked aggregates with parked rows (BatchSize 1,000: it visits 10,000)
// stays well within sweepTimeout (review36c measured 1.58 s against
// 0.6 ms with 10 when it walked them all, once a second, in the round).
func TestSweepTimeBounded(t *testing.T) {
	if os.Getenv("WALRELAY_TEST_LONG") != "1" {
		t.Skip("long (20 s): WALRELAY_TEST_LONG=1")
	}
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, BatchSize: 1000})
	ctx := t.Context()
	if _, err := conn.Exec(ctx, sessionSettings); err != nil {
		t.Fatal(err)
	}
	sweep := func() time.Duration {
		best := time.Hour
		for range 3 {
			tb.cursor = nil
			start := time.Now()
			n, err := tb.sweep(ctx, conn)
			if err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("released %d rows, want none (every aggregate blocked)", n)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, available_at, attempts)
		SELECT gen_random_uuid(), 'order', 'few-' || i, 'T', '{}', now() + interval '1 hour', 3 FROM generate_series(1, 10) i;
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status)
		SELECT gen_random_uuid(), 'order', 'few-' || i, 'T', '{}', 'PARKED' FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	base := sweep()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, available_at, attempts)
		SELECT gen_random_uuid(), 'order', 'many-' || i, 'T', '{}', now() + interval '1 hour', 3 FROM generate_series(1, 100000) i;
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status)
		SELECT gen_random_uuid(), 'order', 'many-' || i, 'T', '{}', 'PARKED' FROM generate_series(1, 100000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		t.Fatal(err)
	}
	many := sweep()
	t.Logf("a sweep that releases nothing: %s with 10 blocked aggregates with parked rows, %s with 100,010 (it visits at most %d)", base, many, tb.sweepCap)
	if many > sweepTimeout/2 {
		t.Fatalf("a sweep that releases nothing takes %s with 100,010 blocked aggregates (%s with 10)", many, base)
	}
}

// TestSweepCutGoesOn (issue 48 item 2): a sweep cut by sweepTimeout
// releases nothing, and the next one must not repeat it whole, or the rows
// only the sweep can release stay PARKED for ever. Here each row set back
// takes 4 ms (a trigger): a sweep of every aggregate (150 free ones, a
// parked row each: 600 ms) is always cut; the sweeps that follow visit
// fewer aggregates, and release them all within a few seconds.
func TestSweepCutGoesOn(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, BatchSize: 100})
	ctx := t.Context()
	const free = 150
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status)
		SELECT gen_random_uuid(), 'order', 'f-' || lpad(i::text, 4, '0'), 'T', '{}', 'PARKED' FROM generate_series(1, $1::int) i`, free); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE FUNCTION slow_release() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.004); RETURN NEW; END $$;
		CREATE TRIGGER slow_release BEFORE UPDATE ON outbox FOR EACH ROW
		WHEN (OLD.status = 'PARKED' AND NEW.status = 'PENDING') EXECUTE FUNCTION slow_release()`); err != nil {
		t.Fatal(err)
	}
	var released int64
	cut := 0
	for i := 0; i < 20 && released < free; i++ {
		n, err := tb.sweep(ctx, conn)
		if err != nil {
			cut++
			continue
		}
		released += n
	}
	if released != free {
		t.Fatalf("20 sweeps released %d of the %d rows parked behind no blocker (%d of them cut by the %s timeout)", released, free, cut, sweepTimeout)
	}
	if cut == 0 {
		t.Fatalf("no sweep was cut: the test shows nothing")
	}
	var parked int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status = 'PARKED'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 0 {
		t.Fatalf("%d rows still PARKED", parked)
	}
}

// TestSweepStepsPastCostlyAggregate: a sweep of one aggregate cut by
// sweepTimeout (its row takes 1 s to set back) moves the cursor past it,
// so the next sweep releases the aggregate after it.
func TestSweepStepsPastCostlyAggregate(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, BatchSize: 100})
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, status) VALUES
		(gen_random_uuid(), 'order', 'a', 'T', '{}', 'PARKED'), (gen_random_uuid(), 'order', 'b', 'T', '{}', 'PARKED');
		CREATE FUNCTION slow_release() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
		CREATE TRIGGER slow_release BEFORE UPDATE ON outbox FOR EACH ROW
		WHEN (OLD.aggregateid = 'a' AND NEW.status = 'PENDING') EXECUTE FUNCTION slow_release()`); err != nil {
		t.Fatal(err)
	}
	tb.sweepSpan = 1
	if n, err := tb.sweep(ctx, conn); err == nil || tb.cursor == nil || *tb.cursor != "a" {
		t.Fatalf("sweep of a: released %d, err %v, cursor %v; want cut, cursor a", n, err, tb.cursor)
	}
	if n, err := tb.sweep(ctx, conn); err != nil || n != 1 {
		t.Fatalf("sweep after a: released %d, err %v; want b's row", n, err)
	}
}
