package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
	"github.com/walrelay/walrelay/replication"
)

// loadSQL writes total outbox rows in transactions of per rows, server-side,
// committing after each.
const loadSQL = `CREATE PROCEDURE bench_load(total int, per int, pad int) LANGUAGE plpgsql AS $$
DECLARE i int := 0;
BEGIN
	WHILE i < total LOOP
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || ((i + g) % 1000), 'OrderCreated',
			jsonb_build_object('seq', i + g, 'pad', repeat('x', pad))
		FROM generate_series(0, least(per, total - i) - 1) AS g;
		COMMIT;
		i := i + per;
	END LOOP;
END $$`

// eosEnv is the environment of walrelay in exactly-once mode.
func eosEnv(o options) []string {
	return []string{"WALRELAY_KAFKA_EXACTLY_ONCE=true", "WALRELAY_KAFKA_OFFSETS_TOPIC={prefix}walrelay.offsets", "WALRELAY_KAFKA_TRANSACTION_INTERVAL=" + o.txnInterval.String()}
}

// variantName shows a variant's settings.
func variantName(env []string) string { return strings.Join(env, " ") }

// result is one contender's run.
type result struct {
	elapsed time.Duration
	rss     int64   // peak resident set, bytes (walrelay only)
	cpu     float64 // CPU seconds (walrelay only)
}

type contender struct {
	name string
	run  func(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, events int) (result, error)
	// resources names the contender in the line of peak RSS and CPU; empty
	// for those whose process is not measured.
	resources string
}

// freshServer starts a throwaway PostgreSQL with the outbox migrated and
// published, and a connection to it; close both with the returned func.
func freshServer(ctx context.Context) (*pgtest.Server, *pgx.Conn, func(), error) {
	pg, err := pgtest.New(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		pg.Close()
		return nil, nil, nil, err
	}
	closeAll := func() {
		conn.Close(context.Background())
		pg.Close()
	}
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	if _, _, err := replication.EnsurePublication(ctx, conn, replication.Outbox{Publication: "walrelay_outbox", Tables: []replication.Table{{Schema: "public", Name: "outbox"}}}); err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return pg, conn, closeAll, nil
}

func catchUp(ctx context.Context, o options, rows int) (string, error) {
	fmt.Fprintf(os.Stderr, "data set: %d rows per transaction: loading %d rows …\n", rows, o.events)
	pg, conn, closeAll, err := freshServer(ctx)
	if err != nil {
		return "", err
	}
	defer closeAll()
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('tpl', 'pgoutput')"); err != nil {
		return "", fmt.Errorf("create the template slot: %w", err)
	}
	if _, err := conn.Exec(ctx, loadSQL); err != nil {
		return "", fmt.Errorf("create the load procedure: %w", err)
	}
	if o.shards > 1 {
		for k := range o.shards {
			if _, err := conn.Exec(ctx, shardPublicationSQL(o.shards, k)); err != nil {
				return "", fmt.Errorf("create the publication of shard %d: %w", k, err)
			}
		}
	}
	began := time.Now()
	if _, err := conn.Exec(ctx, "CALL bench_load($1, $2, $3)", o.events, rows, max(o.payload-30, 0)); err != nil {
		return "", fmt.Errorf("load: %w", err)
	}
	loadRate := float64(o.events) / time.Since(began).Seconds()
	var endText string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&endText); err != nil {
		return "", err
	}
	end, _ := pglogrepl.ParseLSN(endText)
	contenders := []contender{
		{"decoding alone, server side (`pg_logical_slot_peek_binary_changes`)", serverSide, ""},
		{"`pg_recvlogical` (pgoutput, proto 1) to /dev/null", recvlogical, ""},
		{"raw Go receiver, `pglogrepl.Parse` only: **the decode limit**", rawReceiver, ""},
		{"**walrelay** into kfake, until `confirmed_flush_lsn` reaches the end", walrelay(o.bin, kfakeBrokers, 1), "walrelay into kfake"},
	}
	if o.registry {
		contenders = append(contenders, registryContender(o))
	}
	if o.shards > 1 {
		contenders = append(contenders, contender{fmt.Sprintf("walrelay sharded: %d processes, each on its own slot and a publication of the aggregates that hash to it (row filter), into kfake, until every slot reaches the end", o.shards),
			walrelay(o.bin, kfakeBrokers, o.shards), fmt.Sprintf("walrelay in %d shards (sums)", o.shards)})
	}
	if o.realKafka {
		contenders = append(contenders, contender{"walrelay into Apache Kafka " + kafkatest.KafkaVersion + " (one broker on the same 2 cores), the same finish line", walrelay(o.bin, realBrokers, 1), "walrelay into Apache Kafka"})
	}
	if o.kafkaCluster {
		contenders = append(contenders, contender{"walrelay into a three-node Apache Kafka " + kafkatest.KafkaVersion + " cluster (replication factor 3, min.insync.replicas 2, acks=all; all on the same 2 cores), the same finish line",
			walrelay(o.bin, clusterBrokers, 1), "walrelay into a three-node cluster"})
	}
	if o.exactlyOnce {
		eos := eosEnv(o)
		contenders = append(contenders, contender{"walrelay **exactly-once** (Kafka transactions every " + o.txnInterval.String() + ") into kfake, the same finish line", walrelay(o.bin, kfakeBrokers, 1, eos...), "walrelay exactly-once into kfake"})
		if o.realKafka {
			contenders = append(contenders, contender{"walrelay **exactly-once** (Kafka transactions every " + o.txnInterval.String() + ") into Apache Kafka " + kafkatest.KafkaVersion + ", the same finish line", walrelay(o.bin, realBrokers, 1, eos...), "walrelay exactly-once into Apache Kafka"})
		}
	}
	for _, env := range o.variants {
		name := variantName(env)
		contenders = append(contenders, contender{"walrelay into kfake, `" + name + "`", walrelay(o.bin, kfakeBrokers, 1, env...), "walrelay into kfake, " + name})
		if o.exactlyOnce {
			contenders = append(contenders, contender{"walrelay **exactly-once** into kfake, `" + name + "`", walrelay(o.bin, kfakeBrokers, 1, append(eosEnv(o), env...)...),
				"walrelay exactly-once into kfake, " + name})
		}
	}
	if o.debezium {
		contenders = append(contenders, contender{"Debezium " + kafkatest.DebeziumVersion + " (PostgreSQL connector, outbox event router, Kafka Connect standalone) into the same broker, from taking the slot to the same finish line", debezium, "Debezium (its JVM)"})
	}
	res := make([][]result, len(contenders))
	for r := range o.runs {
		for i, c := range contenders {
			slot := fmt.Sprintf("c%d_%d", i, r)
			if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot('tpl', $1)", slot); err != nil {
				return "", fmt.Errorf("copy the template slot: %w", err)
			}
			x, err := c.run(ctx, pg, slot, end, o.events)
			if err != nil {
				return "", fmt.Errorf("%s: %w", c.name, err)
			}
			line := fmt.Sprintf("  run %d: %-60.60s %8.0f events/s", r+1, c.name, float64(o.events)/x.elapsed.Seconds())
			if c.resources != "" {
				line += fmt.Sprintf(", peak RSS %.1f MiB, CPU %.2f s per 100k events", float64(x.rss)/(1<<20), x.cpu/float64(o.events)*100000)
			}
			fmt.Fprintln(os.Stderr, line)
			res[i] = append(res[i], x)
			if err := dropSlot(ctx, conn, slot); err != nil {
				return "", err
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### %d rows per transaction, %d events, %d-byte payloads\n\n", rows, o.events, o.payload)
	fmt.Fprintf(&b, "| what | events/s: median (min to max) of %d | × the decode limit |\n| --- | --- | --- |\n", o.runs)
	rates := make([]stats, len(contenders))
	for i := range contenders {
		var xs []float64
		for _, x := range res[i] {
			xs = append(xs, float64(o.events)/x.elapsed.Seconds())
		}
		rates[i] = summarize(xs)
	}
	limit := rates[2].med
	for i, c := range contenders {
		fmt.Fprintf(&b, "| %s | %s | %.2f |\n", c.name, rates[i], rates[i].med/limit)
	}
	fmt.Fprintf(&b, "| the load itself: one server-side procedure committing each transaction | %s | |\n", human(loadRate))
	b.WriteString("\n")
	for i, con := range contenders {
		if con.resources == "" {
			continue
		}
		var rss, cpu []float64
		for _, x := range res[i] {
			rss = append(rss, float64(x.rss)/(1<<20))
			cpu = append(cpu, x.cpu/float64(o.events)*100000)
		}
		r, c := summarize(rss), summarize(cpu)
		fmt.Fprintf(&b, "%s: peak RSS %.1f MiB (%.1f to %.1f), CPU %.2f s per 100k events (%.2f to %.2f).\n",
			con.resources, r.med, r.lo, r.hi, c.med, c.lo, c.hi)
	}
	return b.String(), nil
}

func serverSide(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, _ int) (result, error) {
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		return result{}, err
	}
	defer conn.Close(context.Background())
	began := time.Now()
	var n int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, NULL,
		'proto_version', '1', 'publication_names', 'walrelay_outbox')`, slot, end.String()).Scan(&n)
	return result{elapsed: time.Since(began)}, err
}

func recvlogical(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, _ int) (result, error) {
	bin, err := pgtest.FindBinDir()
	if err != nil {
		return result{}, err
	}
	began := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_recvlogical"),
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres", pg.Port()),
		"-S", slot, "--start", "--no-loop", "-o", "proto_version=1", "-o", "publication_names=walrelay_outbox",
		"-E", end.String(), "-f", "/dev/null")
	if out, err := cmd.CombinedOutput(); err != nil {
		return result{}, fmt.Errorf("%v: %s", err, out)
	}
	return result{elapsed: time.Since(began)}, nil
}

// rawReceiver streams the slot and only parses each message: what any Go
// consumer of this slot pays at the least.
func rawReceiver(ctx context.Context, pg *pgtest.Server, slot string, _ pglogrepl.LSN, events int) (result, error) {
	cfg, err := replication.ReplicationConfig(pg.DSN)
	if err != nil {
		return result{}, err
	}
	began := time.Now()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return result{}, err
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'walrelay_outbox'", "messages 'true'"},
	}); err != nil {
		return result{}, err
	}
	inserts := 0
	var last pglogrepl.LSN
	next := time.Now().Add(time.Second)
	for {
		if time.Now().After(next) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: last}); err != nil {
				return result{}, err
			}
			next = time.Now().Add(time.Second)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			return result{}, fmt.Errorf("after %d inserts: %w", inserts, err)
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return result{}, err
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return result{}, err
		}
		switch m := m.(type) {
		case *pglogrepl.InsertMessage:
			inserts++
		case *pglogrepl.CommitMessage:
			last = m.TransactionEndLSN
			if inserts >= events {
				return result{elapsed: time.Since(began)}, nil
			}
		}
	}
}

// bigTransaction measures walrelay's peak memory on one transaction of
// o.bigTxn rows: events stream through, so it should not grow with the
// transaction. Each variant (the default; with -exactly-once, that mode;
// each of -variants) streams a copy of the slot, o.runs times,
// interleaved.
func bigTransaction(ctx context.Context, o options) (string, error) {
	fmt.Fprintf(os.Stderr, "large transaction: loading one transaction of %d rows …\n", o.bigTxn)
	pg, conn, closeAll, err := freshServer(ctx)
	if err != nil {
		return "", err
	}
	defer closeAll()
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('big', 'pgoutput')"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || (i % 1000), 'Bulk', jsonb_build_object('seq', i, 'pad', repeat('x', $2::int))
		FROM generate_series(1, $1::int) AS i`, o.bigTxn, max(o.payload-30, 0)); err != nil {
		return "", err
	}
	var endText string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&endText); err != nil {
		return "", err
	}
	end, _ := pglogrepl.ParseLSN(endText)
	type variant struct {
		name string
		env  []string
	}
	variants := []variant{{"at-least-once, the defaults", nil}}
	if o.exactlyOnce {
		variants = append(variants, variant{"exactly-once, the defaults", eosEnv(o)})
	}
	for _, env := range o.variants {
		variants = append(variants, variant{"at-least-once, " + variantName(env), env})
		if o.exactlyOnce {
			variants = append(variants, variant{"exactly-once, " + variantName(env), append(eosEnv(o), env...)})
		}
	}
	res := make([][]result, len(variants))
	for r := range o.runs {
		for i, v := range variants {
			slot := fmt.Sprintf("big%d_%d", i, r)
			if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot('big', $1)", slot); err != nil {
				return "", fmt.Errorf("copy the slot: %w", err)
			}
			x, err := walrelay(o.bin, kfakeBrokers, 1, v.env...)(ctx, pg, slot, end, o.bigTxn)
			if err != nil {
				return "", fmt.Errorf("%s: %w", v.name, err)
			}
			fmt.Fprintf(os.Stderr, "  run %d: one transaction of %d rows, %s: %.0f events/s, peak RSS %.1f MiB\n", r+1, o.bigTxn, v.name, float64(o.bigTxn)/x.elapsed.Seconds(), float64(x.rss)/(1<<20))
			res[i] = append(res[i], x)
			if err := dropSlot(ctx, conn, slot); err != nil {
				return "", err
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### One transaction of %d rows, %d-byte payloads\n\n", o.bigTxn, o.payload)
	fmt.Fprintf(&b, "Including the server's decoding of the whole transaction before its first row is sent; median (min to max) of %d.\n\n", o.runs)
	b.WriteString("| walrelay | events/s | peak RSS, MiB | CPU per 100k events, s |\n| --- | --- | --- | --- |\n")
	for i, v := range variants {
		var rate, rss, cpu []float64
		for _, x := range res[i] {
			rate = append(rate, float64(o.bigTxn)/x.elapsed.Seconds())
			rss = append(rss, float64(x.rss)/(1<<20))
			cpu = append(cpu, x.cpu/float64(o.bigTxn)*100000)
		}
		r, m, c := summarize(rate), summarize(rss), summarize(cpu)
		fmt.Fprintf(&b, "| %s | %s | %.1f (%.1f to %.1f) | %.2f (%.2f to %.2f) |\n", v.name, r, m.med, m.lo, m.hi, c.med, c.lo, c.hi)
	}
	return b.String(), nil
}
