package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/inbox"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/outbox"
)

const inboxTopic = "bench.inbox"

// inboxBench times package inbox against a plain franz-go consumer group
// that runs the same handler (one INSERT) per record in its own
// transaction, with no inbox, on the same records of a 4-partition kfake
// topic, o.runs times each, alternating. The rate is taken between the
// first and the last row the handler wrote (the database's clock), so the
// group's join does not count. fsync is on: the commits cost what they do
// in production.
func inboxBench(ctx context.Context, o options) (string, error) {
	pg, err := pgtest.New(ctx)
	if err != nil {
		return "", err
	}
	defer pg.Close()
	pool, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "ALTER SYSTEM SET fsync = on"); err != nil {
		return "", err
	}
	if _, err := pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return "", err
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return "", err
	}
	kc, err := kafkatest.New(kfake.SeedTopics(4, inboxTopic))
	if err != nil {
		return "", err
	}
	defer kc.Close()
	n := o.inboxEvents
	if err := produceInboxRecords(ctx, kc.Addrs(), n); err != nil {
		return "", err
	}
	var plainRates, inboxRates, plainCommits, inboxCommits []float64
	for run := range o.runs {
		table := fmt.Sprintf("plain_%d", run)
		rate, err := timeHandler(ctx, pool, table, n, func(ctx context.Context) error {
			return plainConsumer(ctx, kc.Addrs(), pool, table)
		})
		if err != nil {
			return "", fmt.Errorf("plain consumer: %w", err)
		}
		plainRates, plainCommits = append(plainRates, rate), append(plainCommits, rate) // a commit per record
		table = fmt.Sprintf("inbox_%d", run)
		reg := prometheus.NewRegistry()
		c, err := inbox.New(inbox.Config{Postgres: pool, Brokers: kc.Addrs(), Topics: []string{inboxTopic}, Group: table, Registerer: reg})
		if err != nil {
			return "", err
		}
		var commits float64
		rate, err = timeHandler(ctx, pool, table, n, func(ctx context.Context) error {
			err := c.Run(ctx, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+table+" (event_id, key) VALUES ($1, $2)", m.ID, string(m.Key))
				return err
			})
			commits = testutil.ToFloat64(counterOf(reg, "walrelay_inbox_db_commits_total"))
			return err
		})
		if err != nil {
			return "", fmt.Errorf("inbox consumer: %w", err)
		}
		inboxRates, inboxCommits = append(inboxRates, rate), append(inboxCommits, rate*commits/float64(n))
		fmt.Printf("inbox run %d: plain %s events/s, inbox %s events/s (%.0f database commits for %d events)\n", run+1, human(plainRates[run]), human(rate), commits, n)
	}
	p, i := summarize(plainRates), summarize(inboxRates)
	var b strings.Builder
	fmt.Fprintf(&b, "#### Consuming with package inbox, %d events on 4 partitions, a handler that inserts one row, fsync on\n\n", n)
	fmt.Fprintf(&b, "| consumer | events/s, median (min to max) of %d | database commits/s (median) | ratio to the plain consumer |\n| --- | --- | --- | --- |\n", o.runs)
	fmt.Fprintf(&b, "| plain franz-go consumer group, one transaction per record, no inbox | %s | %s | 1.00 |\n", p, human(summarize(plainCommits).med))
	fmt.Fprintf(&b, "| package inbox (claim + handler per record, batches of up to 100 per transaction) | %s | %s | %.2f |\n", i, human(summarize(inboxCommits).med), i.med/p.med)
	return b.String(), nil
}

// produceInboxRecords writes n records as walrelay does: key, id and type
// headers, a 100-byte JSON value.
func produceInboxRecords(ctx context.Context, brokers []string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(inboxTopic))
	if err != nil {
		return err
	}
	defer cl.Close()
	value := []byte(`{"order":"` + strings.Repeat("x", 88) + `"}`)
	var first error
	for i := range n {
		r := &kgo.Record{Key: []byte("order-" + strconv.Itoa(i%1000)), Value: value,
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(outbox.NewID())}, {Key: "type", Value: []byte("OrderCreated")}}}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil && first == nil {
				first = err
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	return first
}

// timeHandler creates table, runs consume until table holds n rows, and
// returns the rows per second between the first and the last.
func timeHandler(ctx context.Context, pool *pgxpool.Pool, table string, n int, consume func(context.Context) error) (float64, error) {
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (n bigserial PRIMARY KEY, event_id text NOT NULL, key text NOT NULL, t timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
		return 0, err
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume(cctx) }()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
			cancel()
			return 0, err
		}
		if rows >= n {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			return 0, fmt.Errorf("%d of %d rows after 10 minutes", rows, n)
		}
		select {
		case err := <-done:
			cancel()
			return 0, fmt.Errorf("the consumer stopped with %d of %d rows: %v", rows, n, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return 0, err
	}
	var secs float64
	if err := pool.QueryRow(ctx, "SELECT extract(epoch FROM max(t) - min(t)) FROM "+table).Scan(&secs); err != nil {
		return 0, err
	}
	return float64(n-1) / secs, nil
}

// plainConsumer is the baseline: a franz-go consumer group that inserts
// each record's row in a transaction of its own (autocommit), and commits
// offsets as franz-go does by default. It does not deduplicate.
func plainConsumer(ctx context.Context, brokers []string, pool *pgxpool.Pool, table string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(table), kgo.ConsumeTopics(inboxTopic))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var err error
		fs.EachRecord(func(r *kgo.Record) {
			if err != nil {
				return
			}
			_, err = pool.Exec(ctx, "INSERT INTO "+table+" (event_id, key) VALUES ($1, $2)", string(kafkatest.Header(r, "id")), string(r.Key))
		})
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// counterOf is the sum of a metric family of reg, as a collector for
// testutil.ToFloat64.
func counterOf(reg *prometheus.Registry, name string) prometheus.Collector {
	mfs, _ := reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: name})
	c.Add(sum)
	return c
}
