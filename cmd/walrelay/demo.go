//go:build demo

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/outbox"
)

// The demo links the test harness (kfake, initdb and pg_ctl, the broker
// launcher) and so is built only with the demo tag: go run -tags demo
// ./cmd/walrelay demo. The connector's binary leaves it out (demo_off.go).

// cmdDemo shows the whole pattern on a fresh machine: a throwaway
// PostgreSQL from the local binaries and an in-process Kafka (kfake);
// migrate; an application placing orders, each with its event in the same
// transaction (package outbox); the relay (this binary's run, a child
// process); and a shipping service (`demo consumer`, a child process)
// creating one shipment per order with package inbox. --crash kills the
// relay and the consumer with SIGKILL once each midway; the summary counts
// rows, events on the topic and shipments.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "consumer" {
		return demoConsumer(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("count", 0, "place this many orders, wait for their shipments, print the summary and exit 0 (0: run until interrupted)")
	every := fs.Duration("every", 200*time.Millisecond, "time between two orders")
	crash := fs.Bool("crash", false, "kill the relay and the consumer with SIGKILL once each midway")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *count < 0 {
		return usageError{"--count must not be negative"}
	}
	if *crash && *count == 0 {
		return usageError{"--crash needs --count"}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}

	fmt.Fprintln(stdout, "starting a throwaway PostgreSQL and an in-process Kafka …")
	pg, err := pgtest.New(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	kc, err := kafkatest.New()
	if err != nil {
		return err
	}
	defer kc.Close()
	brokers := strings.Join(kc.Addrs(), ",")

	cs := config.NewSet(flag.NewFlagSet("", flag.ContinueOnError))
	cfg := *cs.Config()
	cfg.Postgres.DSN = pg.DSN
	cfg.Kafka.Brokers = kc.Addrs()
	fmt.Fprintf(stdout, "postgres %s, kafka %s\n", pg.DSN, brokers)
	if err := migrate(ctx, &cfg, false, "", stdout); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		return fmt.Errorf("connect to the demo database: %w", err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{"CREATE TABLE demo_orders (id uuid PRIMARY KEY, customer text NOT NULL, total numeric(12,2) NOT NULL)", "CREATE DATABASE shipping"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	shippingDSN := pg.DSNFor("shipping")

	topic := newTopicCounter(ctx, kc.Addrs())
	defer topic.close()
	relay := &child{name: "walrelay", bin: self, args: []string{"run"}, out: stdout, env: []string{
		"WALRELAY_POSTGRES_DSN=" + pg.DSN, "WALRELAY_KAFKA_BROKERS=" + brokers, "WALRELAY_ADMIN_LISTEN=", "WALRELAY_LOG_LEVEL=warn"}}
	shipping := &child{name: "shipping", bin: self, args: []string{"demo", "consumer", "--dsn", shippingDSN, "--brokers", brokers}, out: stdout}
	for _, c := range []*child{relay, shipping} {
		if err := c.start(); err != nil {
			return err
		}
		defer c.stop()
	}

	placed := 0
	tick := time.NewTicker(*every)
	defer tick.Stop()
	progress := time.NewTicker(2 * time.Second)
	defer progress.Stop()
	report := func() {
		records, ids := topic.counts()
		n, _, _ := shipments(ctx, shippingDSN)
		fmt.Fprintf(stdout, "placed %d orders; on the topic %d records (%d distinct ids); %d shipments\n", placed, records, ids, n)
	}
	for *count == 0 || placed < *count {
		select {
		case <-ctx.Done():
			return demoSummary(stdout, conn, shippingDSN, topic, placed)
		case <-progress.C:
			report()
			continue
		case <-tick.C:
		}
		if err := placeDemoOrder(ctx, conn, placed); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		placed++
		if *crash && placed == *count/3 {
			if err := relay.kill(); err != nil {
				return err
			}
		}
		if *crash && placed == 2**count/3 {
			if err := shipping.kill(); err != nil {
				return err
			}
		}
	}
	// Every order shipped (or a minute passed).
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if n, _, err := shipments(ctx, shippingDSN); err == nil && n >= placed {
			break
		}
		select {
		case <-progress.C:
			report()
		case <-time.After(200 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond) // a second shipment would show
	return demoSummary(stdout, conn, shippingDSN, topic, placed)
}

// placeDemoOrder is what an application does: the order and its event in
// one transaction.
func placeDemoOrder(ctx context.Context, conn *pgx.Conn, n int) error {
	customer := fmt.Sprintf("customer-%d", n%5)
	total := fmt.Sprintf("%d.%02d", 10+n%90, n%100)
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		id := outbox.NewID()
		if _, err := tx.Exec(ctx, "INSERT INTO demo_orders (id, customer, total) VALUES ($1, $2, $3)", id, customer, total); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		payload, _ := json.Marshal(map[string]string{"order_id": id, "customer": customer, "total": total})
		_, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "OrderCreated", Payload: payload})
		return err
	})
}

// demoSummary prints what the demo counted.
func demoSummary(stdout io.Writer, conn *pgx.Conn, shippingDSN string, topic *topicCounter, placed int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var committed int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM demo_orders").Scan(&committed); err != nil {
		return fmt.Errorf("count orders: %w", err)
	}
	n, distinct, err := shipments(ctx, shippingDSN)
	if err != nil {
		return err
	}
	records, ids := topic.counts()
	once := "yes"
	if n != committed || distinct != committed {
		once = "NO"
	}
	fmt.Fprintf(stdout, "\nrows committed: %d orders\nevents on the topic: %d records, %d distinct ids (%d duplicates)\nshipments created: %d for %d orders (exactly one per order: %s)\n",
		committed, records, ids, records-ids, n, distinct, once)
	if once != "yes" {
		return errors.New("the shipments do not match the orders one to one")
	}
	return nil
}

func shipments(ctx context.Context, dsn string) (n, orders int, err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, 0, fmt.Errorf("connect to the shipping database: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT order_id) FROM shipments").Scan(&n, &orders); err != nil {
		return 0, 0, fmt.Errorf("count shipments: %w", err)
	}
	return n, orders, nil
}

// child is a process of the demo (the relay, the consumer), restarted when
// killed.
type child struct {
	name string
	bin  string
	args []string
	env  []string
	out  io.Writer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exited
}

func (c *child) start() error {
	cmd := exec.Command(c.bin, c.args...)
	cmd.Env = append(os.Environ(), c.env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			fmt.Fprintf(c.out, "[%s] %s\n", c.name, s.Text())
		}
	}()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); pw.Close(); close(done) }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	return nil
}

func (c *child) current() (*exec.Cmd, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cmd, c.done
}

// kill kills the child with SIGKILL and starts it again.
func (c *child) kill() error {
	cmd, done := c.current()
	fmt.Fprintf(c.out, "*** SIGKILL %s (pid %d); starting it again\n", c.name, cmd.Process.Pid)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	return c.start()
}

// stop ends the child with SIGTERM and waits for it (15 s, then SIGKILL).
func (c *child) stop() {
	cmd, done := c.current()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// topicCounter counts the records and distinct event ids on the outbox
// topics.
type topicCounter struct {
	cl      *kgo.Client
	mu      sync.Mutex
	records int
	ids     map[string]bool
	done    chan struct{}
}

func newTopicCounter(ctx context.Context, brokers []string) *topicCounter {
	t := &topicCounter{ids: map[string]bool{}, done: make(chan struct{})}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeRegex(), kgo.ConsumeTopics(`outbox\.event\..*`),
		kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		close(t.done)
		return t
	}
	t.cl = cl
	go func() {
		defer close(t.done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil || fs.IsClientClosed() {
				return
			}
			fs.EachRecord(func(r *kgo.Record) {
				t.mu.Lock()
				t.records++
				t.ids[string(kafkatest.Header(r, "id"))] = true
				t.mu.Unlock()
			})
		}
	}()
	return t
}

func (t *topicCounter) counts() (records, ids int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.records, len(t.ids)
}

func (t *topicCounter) close() {
	if t.cl != nil {
		t.cl.Close()
	}
	<-t.done
}

// demoConsumer is the demo's shipping service: one shipment per order,
// through package inbox.
func demoConsumer(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "the shipping database")
	brokers := fs.String("brokers", "", "Kafka brokers, comma-separated")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS shipments (id bigserial PRIMARY KEY, order_id uuid NOT NULL, customer text NOT NULL)`); err != nil {
		return fmt.Errorf("create shipments: %w", err)
	}
	c, err := inbox.New(inbox.Config{Postgres: pool, Brokers: strings.Split(*brokers, ","), Topics: []string{"outbox.event.order"}, Group: "shipping",
		Logger:    slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		KafkaOpts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.RebalanceTimeout(10 * time.Second)}})
	if err != nil {
		return err
	}
	return c.Run(ctx, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		var o struct {
			OrderID  string `json:"order_id"`
			Customer string `json:"customer"`
		}
		if err := json.Unmarshal(m.Value, &o); err != nil {
			return fmt.Errorf("decode order: %w", err)
		}
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, customer) VALUES ($1, $2)", o.OrderID, o.Customer)
		return err
	})
}
