package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// exampleBins builds each example service once, with the faultinject hooks
// compiled in.
var exampleBins sync.Map // name -> func() (string, error)

func exampleBin(t *testing.T, name string) string {
	t.Helper()
	build, _ := exampleBins.LoadOrStore(name, sync.OnceValues(func() (string, error) {
		bin := walrelayBin + "-example-" + name
		args := []string{"build", "-tags", "faultinject", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, filepath.Join("..", "..", "examples", name))...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("build examples/%s: %v\n%s", name, err, out)
		}
		return bin, nil
	}))
	bin, err := build.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestWholePatternOnce runs the pattern end to end: examples/orders places
// orders (each order and its event in one transaction, package outbox)
// without pause; walrelay relays them, and is SIGKILLed twice (which
// leaves duplicates on the topic); examples/shipping consumes them with
// package inbox into its own database, and is killed three times right
// after a database commit and before its offset commit (faultinject), then
// twice more with SIGKILL at random moments. Every order gets exactly one
// shipment.
func TestWholePatternOnce(t *testing.T) {
	long(t)
	t.Parallel()
	pg, kc, col := setup(t)
	orders, shipping := exampleBin(t, "orders"), exampleBin(t, "shipping")
	conn := connect(t, pg.DSN)
	if _, err := conn.Exec(t.Context(), "CREATE DATABASE shipping"); err != nil {
		t.Fatal(err)
	}
	shipConn := connect(t, pg.DSNFor("shipping"))

	relay := &supervisor{t: t, bin: walrelayBin, env: baseEnv(pg, kc)}
	relay.start()
	relay.current().waitLog("msg=streaming", time.Minute)
	ship := &supervisor{t: t, bin: shipping, env: env{},
		args: []string{"-dsn", pg.DSNFor("shipping"), "-brokers", strings.Join(kc.Addrs(), ","), "-topic", kc.topic("order"), "-dlq", kc.prefix + "walrelay.inbox.dlq",
			"-session-timeout", "6s", "-rebalance-timeout", "10s"}, // a killed member holds its partitions this long
		envFor: func(start int64) env {
			if start <= 3 { // killed after its 5th, 40th and 75th database commit
				return env{"WALRELAY_FAULT_KILL_AT": fmt.Sprintf("inbox_committed:%d", 5+35*(start-1))}
			}
			return env{}
		}}
	ship.start()
	placing := startBin(t, orders, env{}, "-dsn", pg.DSN, "-count", "0", "-every", "3ms")

	// The three crashes after a database commit, and walrelay killed once
	// meanwhile.
	time.Sleep(time.Second)
	relay.current().kill()
	waitfor.Until(t, 2*time.Minute, "the three crashes after a database commit", func() bool { return ship.starts.Load() >= 4 })
	// Then SIGKILLs at random moments: walrelay once more, shipping twice,
	// each shipping process once it has its partitions (a crash loop that
	// kills members in the middle of rebalances left kfake's group with
	// partitions assigned to nobody for minutes; not diagnosed).
	rng := rand.New(rand.NewPCG(7, 11))
	for _, p := range []*supervisor{ship, relay, ship} {
		if p == ship {
			p.current().waitLog("partitions assigned", 2*time.Minute)
		}
		time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		p.current().kill()
	}
	time.Sleep(time.Second)
	placing.signal(syscall.SIGTERM)
	if code := placing.exit(30 * time.Second); code != 0 {
		t.Fatalf("orders exited %d:\n%s", code, placing.out.String())
	}
	var placed int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM orders").Scan(&placed); err != nil {
		t.Fatal(err)
	}
	shipped := func() (shipments, ordersShipped int) {
		if err := shipConn.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT order_id) FROM shipments").Scan(&shipments, &ordersShipped); err != nil {
			t.Fatal(err)
		}
		return
	}
	waitfor.Until(t, 4*time.Minute, fmt.Sprintf("%d orders shipped", placed), func() bool { _, n := shipped(); return n >= placed })
	time.Sleep(500 * time.Millisecond) // room for a second shipment
	relay.stop()
	ship.stop()
	shipments, ordersShipped := shipped()
	topic := kc.topic("order")
	onTopic, ids := 0, map[string]bool{}
	for _, r := range col.Records() {
		if r.Topic == topic {
			onTopic++
			ids[string(kafkatest.Header(r, "id"))] = true
		}
	}
	t.Logf("orders placed %d; events on the topic %d (%d distinct, %d duplicates); shipments %d for %d orders; walrelay started %d times, shipping %d times",
		placed, onTopic, len(ids), onTopic-len(ids), shipments, ordersShipped, relay.starts.Load(), ship.starts.Load())
	if ordersShipped != placed || shipments != placed || len(ids) != placed {
		t.Fatalf("want one shipment per order and every event on the topic")
	}
	// Every shipment is of a placed order.
	placedIDs := map[string]bool{}
	for _, id := range texts(t, conn, "SELECT id::text FROM orders") {
		placedIDs[id] = true
	}
	unknown := 0
	for _, id := range texts(t, shipConn, "SELECT order_id::text FROM shipments") {
		if !placedIDs[id] {
			unknown++
		}
	}
	if unknown > 0 {
		t.Fatalf("%d shipments of orders never placed", unknown)
	}
}

// TestConsumerCrashResumes: examples/shipping, consuming with package inbox
// while orders are placed, is SIGKILLed three times 1 to 3 s apart and
// restarted each time; with a stable instance id (static membership) it
// resumes (a shipment committed again) within a second or two of the last
// kill: each restart takes the dead member's place. Without one (dynamic
// membership, against the real broker only: it takes one to three session
// timeouts, as the dead members that had joined are given partitions
// before they expire) it is measured, not bounded. Every order is shipped
// once. The figures are docs/benchmarks.md's "consumer crash" row.
func TestConsumerCrashResumes(t *testing.T) {
	long(t) // three SIGKILLs, timed (docs/benchmarks.md), and the shipping example built
	t.Parallel()
	for _, c := range []struct {
		name, instanceID string
		bound            time.Duration // static: far above what it takes; dynamic: against a stuck group only
	}{{"static", "shipping-0", 20 * time.Second}, {"dynamic", "", 3 * time.Minute}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.instanceID == "" && os.Getenv(kafkatest.EnvKafka) != "real" {
				t.Skip("dynamic membership is measured against the real broker: WALRELAY_TEST_KAFKA=real")
			}
			pg, kc, _ := setup(t)
			orders, shipping := exampleBin(t, "orders"), exampleBin(t, "shipping")
			conn := connect(t, pg.DSN)
			execSQL(t, conn, "CREATE DATABASE shipping")
			shipConn := connect(t, pg.DSNFor("shipping"))
			relay := &supervisor{t: t, bin: walrelayBin, env: baseEnv(pg, kc)}
			relay.start()
			defer relay.stop()
			relay.current().waitLog("msg=streaming", time.Minute)
			ship := &supervisor{t: t, bin: shipping, env: env{}, args: []string{"-dsn", pg.DSNFor("shipping"), "-brokers", strings.Join(kc.Addrs(), ","),
				"-topic", kc.topic("order"), "-dlq", kc.prefix + "walrelay.inbox.dlq", "-instance-id", c.instanceID}}
			ship.start()
			defer ship.stop()
			placing := startBin(t, orders, env{}, "-dsn", pg.DSN, "-count", "0", "-every", "5ms")
			shipped := func() (shipments, distinct int) {
				if err := shipConn.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT order_id) FROM shipments").Scan(&shipments, &distinct); err != nil {
					t.Fatal(err)
				}
				return
			}
			waitfor.Until(t, 2*time.Minute, "shipments", func() bool {
				_, err := shipConn.Exec(context.Background(), "SELECT 1 FROM shipments LIMIT 1")
				if err != nil {
					return false
				}
				n, _ := shipped()
				return n > 50
			})
			rng := rand.New(rand.NewPCG(3, 5))
			for i := range 3 {
				if i > 0 {
					time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
				}
				ship.current().kill()
			}
			killed := time.Now()
			at, _ := shipped()
			if !waitFor(c.bound, func() bool { n, _ := shipped(); return n > at }) {
				t.Fatalf("no shipment %s after the last kill; shipping's log:\n%s", c.bound, tail(ship.current().out.String(), 6000))
			}
			resumed := time.Since(killed)
			time.Sleep(time.Second)
			placing.signal(syscall.SIGTERM)
			if code := placing.exit(30 * time.Second); code != 0 {
				t.Fatalf("orders exited %d:\n%s", code, placing.out.String())
			}
			stopped := time.Now()
			var placed int
			if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM orders").Scan(&placed); err != nil {
				t.Fatal(err)
			}
			waitfor.Until(t, time.Minute, fmt.Sprintf("%d orders shipped", placed), func() bool { _, n := shipped(); return n >= placed })
			drained := time.Since(stopped)
			time.Sleep(500 * time.Millisecond) // room for a second shipment
			shipments, distinct := shipped()
			t.Logf("%s membership: resumed %.1f s after the last of 3 SIGKILLs; the last of %d orders shipped %.1f s after the writer stopped; %d shipments of %d orders; shipping started %d times",
				c.name, resumed.Seconds(), placed, drained.Seconds(), shipments, distinct, ship.starts.Load())
			if shipments != placed || distinct != placed {
				t.Fatalf("want one shipment per order")
			}
		})
	}
}

// waitFor polls cond every 20ms until it holds (true) or timeout passes
// (false).
func waitFor(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestOutboxWriterRollsBack: events written with package outbox in
// transactions that roll back (pgx and database/sql) never reach the
// topic; those of the transactions that commit do, once each.
func TestOutboxWriterRollsBack(t *testing.T) {
	t.Parallel()
	pg, kc, col := setup(t)
	streaming(t, baseEnv(pg, kc))
	ctx := t.Context()
	conn := connect(t, pg.DSN)
	db, err := sql.Open("pgx", pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var committed, rolledBack []string
	for i := range 20 {
		e := outbox.Event{AggregateType: "order", AggregateID: "o-" + strconv.Itoa(i), Type: "OrderCreated", Payload: []byte(`{"seq":1}`)}
		commit := i%2 == 0
		var id string
		if i%4 < 2 {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if id, err = outbox.Write(ctx, tx, e); err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		} else {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if id, err = outbox.WriteSQL(ctx, tx, e); err != nil {
				t.Fatal(err)
			}
			if commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			committed = append(committed, id)
		} else {
			rolledBack = append(rolledBack, id)
		}
	}
	c := waitAll(t, col, committed, time.Minute)
	time.Sleep(500 * time.Millisecond)
	onTopic := map[string]bool{}
	for _, r := range col.Records() {
		onTopic[string(kafkatest.Header(r, "id"))] = true
	}
	for _, id := range rolledBack {
		if onTopic[id] {
			t.Fatalf("event %s of a rolled-back transaction is on the topic", id)
		}
	}
	if c.duplicates != 0 || c.missing != 0 {
		t.Fatalf("%s", c)
	}
}

// TestOrdersExampleKeepsToItsTable: examples/orders on a database that has
// an orders table of its own refuses to write into it, and leaves it as it
// was; on a database without one it creates its own and places orders.
func TestOrdersExampleKeepsToItsTable(t *testing.T) {
	t.Parallel()
	pg, kc, _, conn := bareSetup(t)
	mustRun(t, baseEnv(pg, kc), "migrate")
	orders := exampleBin(t, "orders")
	execSQL(t, conn, "CREATE TABLE orders (id bigint PRIMARY KEY, note text)", "INSERT INTO orders VALUES (1, 'a real order')")
	p := startBin(t, orders, env{}, "-dsn", pg.DSN, "-count", "3")
	if code := p.exit(time.Minute); code == 0 || !strings.Contains(p.out.String(), "a table orders exists that this example did not create") {
		t.Fatalf("orders on a database with its own orders table: exit %d\n%s", code, p.out.String())
	}
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM orders").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the application's orders table holds %d rows (%v), want its 1", n, err)
	}
	execSQL(t, conn, "DROP TABLE orders")
	for range 2 { // creates its table, then finds it its own
		if p := startBin(t, orders, env{}, "-dsn", pg.DSN, "-count", "3"); p.exit(time.Minute) != 0 {
			t.Fatalf("orders: %s", p.out.String())
		}
	}
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM orders").Scan(&n); err != nil || n != 6 {
		t.Fatalf("orders placed %d (%v), want 6", n, err)
	}
}
