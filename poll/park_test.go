package poll

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/recovery"
)

// claimReads runs one claim of tb in a transaction it rolls back, and
// returns the claimed rows' aggregates and how many blocks of the outbox
// and its indexes the claim read (pg_stat_get_xact_blocks_fetched: the
// transaction's own counts, hits and reads alike): the work of the claim,
// which machines' speed does not change. It vacuums the outbox first
// (probeReads).
func claimReads(t *testing.T, conn *pgx.Conn, tb *table) ([]string, int64) {
	t.Helper()
	// The index entries of the rows' versions before they were parked
	// are read until a scan finds them dead, or a vacuum removes them:
	// what is measured is the claims after that (probeReads vacuums).
	var aggs []string
	n := probeReads(t, conn, func(tx pgx.Tx) {
		rows, _, err := tb.claim(t.Context(), tx.Conn(), "measure:1")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			aggs = append(aggs, r.e.AggregateID)
		}
	})
	return aggs, n
}

// insertMany inserts n rows of aggregate agg in one statement (each its
// own created_at, from clock_timestamp()).
func insertMany(t *testing.T, conn *pgx.Conn, agg string, n int) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', $1, 'T', '{}' FROM generate_series(1, $2::int)`, agg, n); err != nil {
		t.Fatal(err)
	}
}

// TestClaimBehindBlockedAggregateBounded (issue 36 item 6): the blocks a
// claim reads do not grow with the backlog of a blocked aggregate (its
// first row in backoff, or DEAD under on_dead block). The claim is
// measured twice, with 20 rows and then with 3,020 rows behind the
// blocked one, after the claims that saw them (a claim parks the rows it
// passes over behind a blocked row, at most ten batches); each time it takes the 5 rows of other
// aggregates and none of the blocked one. Before, each claim read every
// row of the backlog: its reads grew with it, about 3 blocks a row.
func TestClaimBehindBlockedAggregateBounded(t *testing.T) {
	t.Parallel()
	for _, head := range []struct{ name, onDead, set string }{
		{"backoff", DeadSkip, "available_at = now() + interval '1 hour', attempts = 1"},
		{"dead_block", DeadBlock, "status = 'DEAD', attempts = 20"},
	} {
		t.Run(head.name, func(t *testing.T) {
			t.Parallel()
			conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: head.onDead})
			ctx := t.Context()
			insertMany(t, conn, "blocked", 21)
			if _, err := conn.Exec(ctx, `UPDATE outbox SET `+head.set+`
				WHERE id = (SELECT id FROM outbox WHERE aggregateid = 'blocked' ORDER BY created_at, id LIMIT 1)`); err != nil {
				t.Fatal(err)
			}
			others := func(round int) []string {
				var want []string
				for i := range 5 {
					agg := fmt.Sprintf("other-%d-%d", round, i)
					insertMany(t, conn, agg, 1)
					want = append(want, agg)
				}
				return want
			}
			// A claim that commits (it sees the backlog), then the
			// measured one.
			others(0)
			if _, _, err := tb.claim(ctx, conn, "w:1"); err != nil {
				t.Fatal(err)
			}
			want := others(1)
			got, small := claimReads(t, conn, tb)
			if !slices.Equal(got, want) {
				t.Fatalf("20 rows behind the blocked one: claimed %v, want %v", got, want)
			}
			insertMany(t, conn, "blocked", 3000)
			// A claim parks at most parkBatches batches (1,000 rows here):
			// the claims that park the backlog, then the measured one.
			for i := range 3 {
				if _, _, err := tb.claim(ctx, conn, fmt.Sprintf("w:2.%d", i)); err != nil {
					t.Fatal(err)
				}
				var parked int
				if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE status = 'PARKED'").Scan(&parked); err != nil {
					t.Fatal(err)
				}
				if want := 20 + 1000*(i+1); parked != want {
					t.Fatalf("after %d claims: %d rows parked, want %d (ten batches a claim)", i+1, parked, want)
				}
			}
			want = others(2)
			got, large := claimReads(t, conn, tb)
			if !slices.Equal(got, want) {
				t.Fatalf("3,020 rows behind the blocked one: claimed %v, want %v", got, want)
			}
			t.Logf("blocks read by a claim: %d with 20 rows behind the blocked row, %d with 3,020", small, large)
			if large > 2*small+50 {
				t.Fatalf("a claim read %d blocks with 3,020 rows behind the blocked row, %d with 20: its work grows with the blocked backlog", large, small)
			}
		})
	}
}

// statuses returns the status of each named row.
func statuses(t *testing.T, conn *pgx.Conn, ids map[string]string, names ...string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		var st string
		if err := conn.QueryRow(t.Context(), "SELECT status FROM outbox WHERE id = $1", ids[n]).Scan(&st); err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}

// markAs marks the named rows of claim as st (as the poller's mark does).
func markAs(t *testing.T, conn *pgx.Conn, tb *table, claim, st string, ids map[string]string, names ...string) {
	t.Helper()
	var m marks
	for _, n := range names {
		m.add(ids[n], st, 0, 0, "")
	}
	n, err := tb.mark(t.Context(), conn, claim, &m)
	if err != nil {
		t.Fatal(err)
	}
	if int(n) != len(names) {
		t.Fatalf("marked %d rows %s, want %d", n, st, len(names))
	}
}

// release runs tb's release and returns how many rows it set PENDING.
func release(t *testing.T, conn *pgx.Conn, tb *table) int64 {
	t.Helper()
	n, err := tb.release(t.Context(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sentAgain is the end of a block of a-0 that leaves it unsent (what says
// how): no row behind it is released, the next claim takes a-0 alone,
// and it is marked SENT.
func sentAgain(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string, what string) {
	t.Helper()
	if n := release(t, conn, tb); n != 0 {
		t.Fatalf("released %d rows while a-0 is unsent", n)
	}
	if got, want := claimNames(t, conn, tb, "w:u", ids), []string{"a-0"}; !slices.Equal(got, want) {
		t.Fatalf("a-0 %s: claimed %v, want %v", what, got, want)
	}
	markAs(t, conn, tb, "w:u", "SENT", ids, "a-0")
}

// TestParkedRowsKeepOrder: the rows behind a blocked row are parked by the
// claim that passes them over, a row inserted later for the blocked
// aggregate too; none is claimed ahead of the blocked row, whatever
// unblocks it; once it is sent (by the poller, by dlq replay), DEAD with
// on_dead skip, or deleted, they are released in order, at most a batch
// of them at a time; ordering none releases every parked row.
func TestParkedRowsKeepOrder(t *testing.T) {
	t.Parallel()
	type step func(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string)
	for _, c := range []struct {
		name, onDead, block string
		// unblock ends the block of a-0; the rows behind it then go.
		unblock step
	}{
		{"backoff_then_sent", DeadSkip, "available_at = now() + interval '1 hour', attempts = 1", func(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string) {
			set(t, conn, ids["a-0"], "available_at = now()") // its backoff ends
			sentAgain(t, conn, tb, ids, "due again")
		}},
		{"backoff_then_dead_skip", DeadSkip, "available_at = now() + interval '1 hour', attempts = 1", func(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string) {
			set(t, conn, ids["a-0"], "status = 'DEAD'") // out of attempts: skip lets the rest go
		}},
		{"dead_block_then_poll_retry", DeadBlock, "status = 'DEAD', attempts = 20", func(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string) {
			if _, _, err := Retry(t.Context(), conn, tb.rt.Layout(), []string{ids["a-0"]}, false, false); err != nil {
				t.Fatal(err)
			}
			sentAgain(t, conn, tb, ids, "retried")
		}},
		{"dead_block_then_dlq_replay", DeadBlock, "status = 'DEAD', attempts = 20", func(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string) {
			// recovery's markReplayed, after dlq replay sent it.
			set(t, conn, ids["a-0"], "status = 'SENT', sent_at = now(), claim_id = 'dlq-replay:x'")
		}},
		{"dead_block_then_deleted", DeadBlock, "status = 'DEAD', attempts = 20", func(t *testing.T, conn *pgx.Conn, tb *table, ids map[string]string) {
			if _, err := conn.Exec(t.Context(), "DELETE FROM outbox WHERE id = $1", ids["a-0"]); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: c.onDead})
			ids := map[string]string{}
			insert(t, conn, ids, "a", "a", "b", "a")
			set(t, conn, ids["a-0"], c.block)
			if got, want := claimNames(t, conn, tb, "w:1", ids), []string{"b-0"}; !slices.Equal(got, want) {
				t.Fatalf("a-0 blocked: claimed %v, want %v", got, want)
			}
			if got, want := statuses(t, conn, ids, "a-1", "a-2"), []string{"PARKED", "PARKED"}; !slices.Equal(got, want) {
				t.Fatalf("rows behind a-0: %v, want %v", got, want)
			}
			// A row inserted for the blocked aggregate waits and is
			// parked; a row of another aggregate goes.
			insert(t, conn, ids, "a", "b")
			markAs(t, conn, tb, "w:1", "SENT", ids, "b-0")
			if n := release(t, conn, tb); n != 0 {
				t.Fatalf("released %d rows while a-0 blocks them", n)
			}
			if got, want := claimNames(t, conn, tb, "w:2", ids), []string{"b-1"}; !slices.Equal(got, want) {
				t.Fatalf("a-3 inserted behind the blocked a-0: claimed %v, want %v", got, want)
			}
			if got, want := statuses(t, conn, ids, "a-3"), []string{"PARKED"}; !slices.Equal(got, want) {
				t.Fatalf("a-3 inserted behind the blocked a-0: %v, want %v", got, want)
			}
			c.unblock(t, conn, tb, ids)
			// At most a batch of an aggregate's parked rows at a time.
			tb.batch = 2
			if n := release(t, conn, tb); n != 2 {
				t.Fatalf("released %d rows, want 2 (a batch)", n)
			}
			tb.batch = 100
			insert(t, conn, ids, "a") // a-4, behind a-3, still parked: it waits
			if got, want := claimNames(t, conn, tb, "w:3", ids), []string{"a-1", "a-2"}; !slices.Equal(got, want) {
				t.Fatalf("a-0 unblocked: claimed %v, want %v", got, want)
			}
			markAs(t, conn, tb, "w:3", "SENT", ids, "a-1", "a-2")
			if n := release(t, conn, tb); n != 1 {
				t.Fatalf("released %d rows, want 1 (a-3; a-4 was not parked yet)", n)
			}
			if got, want := claimNames(t, conn, tb, "w:4", ids), []string{"a-3", "a-4"}; !slices.Equal(got, want) {
				t.Fatalf("then: claimed %v, want %v", got, want)
			}
		})
	}
	t.Run("ordering_none_releases", func(t *testing.T) {
		t.Parallel()
		conn, tb := claimFixture(t, Config{Ordering: OrderAggregate})
		ids := map[string]string{}
		insert(t, conn, ids, "a", "a", "a")
		set(t, conn, ids["a-0"], "available_at = now() + interval '1 hour', attempts = 1")
		if got := claimNames(t, conn, tb, "w:1", ids); len(got) != 0 {
			t.Fatalf("a-0 blocked: claimed %v", got)
		}
		none := newTable(tb.rt, Config{Ordering: OrderNone, BatchSize: 100, MaxBatchBytes: 8 << 20, Lease: 30e9})
		if n := release(t, conn, none); n != 2 {
			t.Fatalf("ordering none released %d parked rows, want 2", n)
		}
		if got, want := claimNames(t, conn, none, "w:2", ids), []string{"a-1", "a-2"}; !slices.Equal(got, want) {
			t.Fatalf("ordering none: claimed %v, want %v", got, want)
		}
	})
}

// TestParkingWorkersKeepOrder: three workers release, claim and mark at
// once (a row fails into a short backoff now and then, or goes DEAD under
// on_dead block and is retried by an operator loop) while rows of four
// aggregates are inserted one by one: parking and release race claims,
// marks, retries and inserts. A deferred trigger records every row set
// SENT while an earlier row of its aggregate is unsent: there must be
// none, and every row must end SENT (none left parked). Each worker has
// its connection and table, as each poller does, with the poller's session
// settings.
func TestParkingWorkersKeepOrder(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate, OnDead: DeadBlock})
	ctx := t.Context()
	for _, s := range []string{
		"CREATE TABLE violations (id uuid, aggregateid text)",
		"CREATE TABLE parkings (id uuid)",
		`CREATE FUNCTION check_order() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			IF NEW.status = 'SENT' AND EXISTS (SELECT 1 FROM outbox e WHERE e.aggregateid = NEW.aggregateid
				AND e.status <> 'SENT' AND (e.created_at, e.id) < (NEW.created_at, NEW.id)) THEN
				INSERT INTO violations VALUES (NEW.id, NEW.aggregateid);
			END IF;
			IF NEW.status = 'PARKED' THEN
				INSERT INTO parkings VALUES (NEW.id);
			END IF;
			RETURN NULL;
		END $$`,
		"CREATE CONSTRAINT TRIGGER check_order AFTER UPDATE ON outbox DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION check_order()",
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	connect := func() *pgx.Conn {
		c, err := pgx.ConnectConfig(ctx, conn.Config())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		if _, err := c.Exec(ctx, sessionSettings); err != nil { // as the poller's session
			t.Fatal(err)
		}
		return c
	}
	const rows = 240
	stop := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	wg.Go(func() { // the application
		c := connect()
		for i := range rows {
			if _, err := c.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
				VALUES (gen_random_uuid(), 'order', $1, 'T', '{}')`, fmt.Sprintf("agg-%d", i%4)); err != nil {
				errs <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Go(func() { // an operator retrying the DEAD rows
		c := connect()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, _, err := Retry(ctx, c, tb.rt.Layout(), nil, true, false); err != nil {
				errs <- err
				return
			}
		}
	})
	for w := range 3 {
		wg.Go(func() {
			c := connect()
			// A table of its own, as each poller has.
			rt, err := recovery.Open(ctx, c, tb.rt.Layout())
			if err != nil {
				errs <- err
				return
			}
			tb := newTable(rt, Config{Ordering: OrderAggregate, OnDead: DeadBlock, BatchSize: 8, MaxBatchBytes: 8 << 20, MaxEventBytes: 1 << 20, Lease: 30e9})
			rnd := rand.New(rand.NewPCG(uint64(w), 36))
			for n := 1; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				claim := fmt.Sprintf("w%d:%d", w, n)
				// The sweep now and then, as the poller runs it (once per
				// sweepEvery); the mark's release after every mark.
				if n%10 == 1 {
					if _, err := tb.release(ctx, c); err != nil {
						errs <- fmt.Errorf("release: %w", err)
						return
					}
				}
				rs, _, err := tb.claim(ctx, c, claim)
				if err != nil {
					errs <- fmt.Errorf("claim: %w", err)
					return
				}
				var m marks
				failed := map[string]bool{}
				for _, r := range rs {
					switch x := rnd.IntN(100); {
					case failed[r.e.AggregateID]: // behind a failure: back at once
						m.add(r.id, "PENDING", 0, 1, "")
					case x < 10:
						failed[r.e.AggregateID] = true
						m.add(r.id, "PENDING", 0.02+rnd.Float64()*0.05, 0, "boom")
					case x < 13:
						failed[r.e.AggregateID] = true
						m.add(r.id, "DEAD", 0, 0, "dead")
					default:
						m.add(r.id, "SENT", 0, 0, "")
					}
				}
				if len(rs) > 0 {
					if _, err := tb.mark(ctx, c, claim, &m); err != nil {
						errs <- fmt.Errorf("mark: %w", err)
						return
					}
					if _, err := tb.releaseMarked(ctx, c, m.ids); err != nil {
						errs <- fmt.Errorf("release after the mark: %w", err)
						return
					}
				} else {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var unsent, total int
		if err := conn.QueryRow(ctx, "SELECT count(*) FILTER (WHERE status <> 'SENT'), count(*) FROM outbox").Scan(&unsent, &total); err != nil {
			t.Fatal(err)
		}
		if total == rows && unsent == 0 {
			break
		}
		select {
		case err := <-errs:
			close(stop)
			wg.Wait()
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			var states string
			_ = conn.QueryRow(ctx, "SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) n FROM outbox GROUP BY 1) s").Scan(&states)
			t.Fatalf("rows left unsent after 30 s: %s", states)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	var bad int
	var parked int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM violations").Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad > 0 {
		t.Fatalf("%d rows were sent while an earlier row of their aggregate was unsent", bad)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM parkings").Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked == 0 {
		t.Fatal("no row was parked: the test did not exercise parking")
	}
	t.Logf("%d rows sent in order; rows parked %d times", rows, parked)
}

// TestCheckTableWantsParking: an outbox migrated by an earlier version (a
// status check without PARKED, no parked index) is refused by check and
// run, naming what it lacks and walrelay migrate --poll; migrate --poll
// brings it to the new layout, keeping its rows and their states.
func TestCheckTableWantsParking(t *testing.T) {
	t.Parallel()
	conn, _ := claimFixture(t, Config{Ordering: OrderAggregate})
	ctx := t.Context()
	l := decoder.Config{}.WithDefaults().Layouts()[0]
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox DROP CONSTRAINT outbox_walrelay_status,
			ADD CONSTRAINT outbox_walrelay_status CHECK (status IN ('PENDING', 'SENDING', 'SENT', 'DEAD'));
		DROP INDEX outbox_walrelay_parked`); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	insert(t, conn, ids, "a", "a")
	set(t, conn, ids["a-0"], "status = 'DEAD'")
	err := CheckTable(ctx, conn, l)
	for _, want := range []string{"constraint outbox_walrelay_status allowing status PARKED", "index outbox_walrelay_parked", "walrelay migrate --poll"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("CheckTable of an outbox of an earlier version: %v, want it to name %q", err, want)
		}
	}
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := CheckTable(ctx, conn, l); err != nil {
		t.Fatalf("CheckTable after migrate --poll: %v", err)
	}
	if got, want := statuses(t, conn, ids, "a-0", "a-1"), []string{"DEAD", "PENDING"}; !slices.Equal(got, want) {
		t.Fatalf("rows after migrate --poll: %v, want %v", got, want)
	}
	set(t, conn, ids["a-1"], "status = 'PARKED'")
	if _, err := conn.Exec(ctx, "UPDATE outbox SET status = 'PARKING' WHERE id = $1", ids["a-1"]); err == nil {
		t.Fatal("the status check let an unknown status in")
	}
	// Re-running changes nothing.
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		t.Fatal(err)
	}
}
