//go:build demo

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
	"github.com/walrelay/walrelay/outbox"
)

// The demo links the test harness (kfake, initdb and pg_ctl, the broker
// launcher) and so is built only with the demo tag: go run -tags demo
// ./cmd/walrelay demo. The connector's binary leaves it out (demo_off.go).

// cmdDemo shows walrelay end to end on a fresh machine: a throwaway
// PostgreSQL from the local binaries, an in-process Kafka (kfake), migrate,
// an application writing orders with their outbox rows, the relay, and a
// consumer printing each event it reads.
func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("count", 0, "exit 0 after this many events were consumed (0: run until interrupted)")
	every := fs.Duration("every", 200*time.Millisecond, "time between two orders")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *count < 0 {
		return usageError{"--count must not be negative"}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

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

	var cfg config.Config
	cs := config.NewSet(flag.NewFlagSet("", flag.ContinueOnError))
	cfg = *cs.Config()
	cfg.Postgres.DSN = pg.DSN
	cfg.Kafka.Brokers = kc.Addrs()
	cfg.Admin.Listen = ""
	fmt.Fprintf(stdout, "postgres %s, kafka %v\n", pg.DSN, cfg.Kafka.Brokers)
	if err := migrate(ctx, &cfg, stdout); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		return fmt.Errorf("connect to the demo database: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE demo_orders (id bigserial PRIMARY KEY, customer text NOT NULL, total numeric(12,2) NOT NULL)`); err != nil {
		return fmt.Errorf("create demo_orders: %w", err)
	}

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	relayErr := make(chan error, 1)
	go func() { relayErr <- run(ctx, &cfg, log) }()

	consumed := make(chan error, 1)
	go func() { consumed <- consume(ctx, kc.Addrs(), *count, stdout) }()

	written := 0
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for {
		if *count == 0 || written < *count {
			if err := writeOrder(ctx, conn, written); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			written++
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-relayErr:
			if err == nil {
				err = errors.New("relay stopped")
			}
			return err
		case err := <-consumed:
			if err == nil {
				fmt.Fprintf(stdout, "consumed %d events; stopping\n", *count)
			}
			cancel()
			if rerr := <-relayErr; err == nil {
				err = rerr
			}
			return err
		case <-tick.C:
		}
	}
}

// writeOrder is what an application does: the business row and its outbox
// row in one transaction.
func writeOrder(ctx context.Context, conn *pgx.Conn, n int) error {
	customer := fmt.Sprintf("customer-%d", n%5)
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var id int64
		total := fmt.Sprintf("%d.%02d", 10+n%90, n%100)
		if err := tx.QueryRow(ctx, "INSERT INTO demo_orders (customer, total) VALUES ($1, $2) RETURNING id", customer, total).Scan(&id); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		payload := fmt.Sprintf(`{"order_id": %d, "customer": %q, "total": %s}`, id, customer, total)
		_, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'OrderCreated', $3)",
			outbox.NewID(), fmt.Sprintf("order-%d", id), payload)
		if err != nil {
			return fmt.Errorf("insert outbox row: %w", err)
		}
		return nil
	})
}

// consume prints each event read from the outbox topics; with n > 0 it
// returns nil after n distinct event ids.
func consume(ctx context.Context, brokers []string, n int, stdout io.Writer) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeRegex(), kgo.ConsumeTopics(`outbox\.event\..*`),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		return fmt.Errorf("create consumer: %w", err)
	}
	defer cl.Close()
	seen := map[string]bool{}
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fs.EachRecord(func(r *kgo.Record) {
			id := string(kafkatest.Header(r, "id"))
			seen[id] = true
			fmt.Fprintf(stdout, "topic=%s partition=%d offset=%d key=%s id=%s type=%s\n",
				r.Topic, r.Partition, r.Offset, r.Key, id, kafkatest.Header(r, "type"))
		})
		if n > 0 && len(seen) >= n {
			return nil
		}
	}
}
