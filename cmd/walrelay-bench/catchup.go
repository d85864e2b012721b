package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
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
		eos := []string{"WALRELAY_KAFKA_EXACTLY_ONCE=true", "WALRELAY_KAFKA_OFFSETS_TOPIC={prefix}walrelay.offsets", "WALRELAY_KAFKA_TRANSACTION_INTERVAL=" + o.txnInterval.String()}
		contenders = append(contenders, contender{"walrelay **exactly-once** (Kafka transactions every " + o.txnInterval.String() + ") into kfake, the same finish line", walrelay(o.bin, kfakeBrokers, 1, eos...), "walrelay exactly-once into kfake"})
		if o.realKafka {
			contenders = append(contenders, contender{"walrelay **exactly-once** (Kafka transactions every " + o.txnInterval.String() + ") into Apache Kafka " + kafkatest.KafkaVersion + ", the same finish line", walrelay(o.bin, realBrokers, 1, eos...), "walrelay exactly-once into Apache Kafka"})
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
			fmt.Fprintf(os.Stderr, "  run %d: %-60.60s %8.0f events/s\n", r+1, c.name, float64(o.events)/x.elapsed.Seconds())
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

// brokers gives one walrelay run its Kafka: the brokers' addresses, a
// topic prefix of the run's own, and what to close afterwards.
type brokers func() (addrs []string, prefix string, closeFn func(), err error)

// kfakeBrokerCount is the brokers of each kfake cluster (-kfake-brokers).
var kfakeBrokerCount = 1

// newKfake starts a kfake cluster of kfakeBrokerCount brokers.
func newKfake() (*kafkatest.Cluster, error) {
	return kafkatest.New(kfake.NumBrokers(kfakeBrokerCount))
}

// kfakeBrokers is a fresh kfake cluster per run.
func kfakeBrokers() ([]string, string, func(), error) {
	kc, err := newKfake()
	if err != nil {
		return nil, "", nil, err
	}
	return kc.Addrs(), "", kc.Close, nil
}

// realKafka is one Apache Kafka broker for the whole benchmark (-real-kafka),
// started on first use; each run writes topics under a prefix of its own.
var (
	realKafka = sync.OnceValues(func() (*kafkatest.Real, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		fmt.Fprintln(os.Stderr, "starting Apache Kafka "+kafkatest.KafkaVersion+" …")
		return kafkatest.NewReal(ctx)
	})
	realRuns atomic.Int64
)

// realCluster is one three-node Apache Kafka cluster for the whole
// benchmark (-kafka-cluster), started on first use.
var (
	realCluster = sync.OnceValues(func() (*kafkatest.RealCluster, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		fmt.Fprintln(os.Stderr, "starting a three-node Apache Kafka "+kafkatest.KafkaVersion+" cluster …")
		return kafkatest.NewRealCluster(ctx)
	})
	clusterRuns atomic.Int64
)

func clusterBrokers() ([]string, string, func(), error) {
	c, err := realCluster()
	if err != nil {
		return nil, "", nil, err
	}
	return c.Addrs(), fmt.Sprintf("bench%d.", clusterRuns.Add(1)), func() {}, nil
}

func realBrokers() ([]string, string, func(), error) {
	r, err := realKafka()
	if err != nil {
		return nil, "", nil, err
	}
	return r.Addrs(), fmt.Sprintf("bench%d.", realRuns.Add(1)), func() {}, nil
}

// walrelay runs the walrelay binary on the slot into the Kafka of kafka and
// stops the clock when the slot confirmed the end LSN.
func walrelay(bin string, kafka brokers, shards int, extraEnv ...string) func(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, _ int) (result, error) {
	return func(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, _ int) (result, error) {
		addrs, prefix, closeKafka, err := kafka()
		if err != nil {
			return result{}, err
		}
		defer closeKafka()
		conn, err := pgx.Connect(ctx, pg.DSN)
		if err != nil {
			return result{}, err
		}
		defer conn.Close(context.Background())
		// Shard k streams a copy of the slot through the publication of
		// the rows whose aggregate hashes to k.
		slots := []string{slot}
		for k := 1; k < shards; k++ {
			copied := fmt.Sprintf("%s_shard%d", slot, k)
			if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", slot, copied); err != nil {
				return result{}, fmt.Errorf("copy the slot for shard %d: %w", k, err)
			}
			defer dropSlot(context.Background(), conn, copied) //nolint:errcheck // best effort: the server is thrown away
			slots = append(slots, copied)
		}
		// Each process writes its own buffer, read only once it has exited.
		type child struct {
			cmd  *exec.Cmd
			out  bytes.Buffer
			done chan struct{} // closed when Wait returned
		}
		var children []*child
		stop := func() {
			for _, c := range children {
				_ = c.cmd.Process.Signal(syscall.SIGTERM)
				<-c.done
			}
		}
		defer stop()
		began := time.Now()
		for k, sl := range slots {
			c := &child{cmd: exec.Command(bin, "run"), done: make(chan struct{})}
			admin := ""
			if profilePath != "" && k == 0 {
				admin = "127.0.0.1:18088"
			}
			c.cmd.Env = append(os.Environ(), "WALRELAY_POSTGRES_DSN="+pg.DSN, "WALRELAY_KAFKA_BROKERS="+strings.Join(addrs, ","),
				"WALRELAY_KAFKA_TOPIC="+prefix+"outbox.event.{aggregatetype}", "WALRELAY_KAFKA_DLQ_TOPIC="+prefix+"walrelay.dlq",
				"WALRELAY_POSTGRES_SLOT="+sl, "WALRELAY_ADMIN_LISTEN="+admin, "WALRELAY_ADMIN_PPROF=true", "WALRELAY_LOG_LEVEL=warn")
			if shards > 1 {
				c.cmd.Env = append(c.cmd.Env, "WALRELAY_POSTGRES_PUBLICATION="+shardPublication(shards, k), "WALRELAY_POSTGRES_ALLOW_ROW_FILTER=true")
			}
			for _, kv := range extraEnv {
				c.cmd.Env = append(c.cmd.Env, strings.ReplaceAll(kv, "{prefix}", prefix))
			}
			c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
			if err := c.cmd.Start(); err != nil {
				return result{}, err
			}
			go func() { _ = c.cmd.Wait(); close(c.done) }()
			children = append(children, c)
		}
		if profilePath != "" {
			go profile("127.0.0.1:18088", profilePath)
			profilePath = "" // one profile a run of the bench
		}
		for {
			var text string
			if err := conn.QueryRow(ctx, "SELECT min(confirmed_flush_lsn)::text FROM pg_replication_slots WHERE slot_name = ANY($1)", slots).Scan(&text); err != nil {
				return result{}, err
			}
			if lsn, _ := pglogrepl.ParseLSN(text); lsn >= end {
				break
			}
			for _, c := range children {
				select {
				case <-c.done:
					return result{}, fmt.Errorf("walrelay exited before confirming %s:\n%s", end, c.out.String())
				default:
				}
			}
			if time.Since(began) > 10*time.Minute {
				stop()
				return result{}, fmt.Errorf("walrelay did not confirm %s in 10 minutes:\n%s", end, children[0].out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		x := result{elapsed: time.Since(began)}
		for _, c := range children {
			rss, cpu := procStats(c.cmd.Process.Pid)
			x.rss += rss
			x.cpu += cpu
		}
		return x, nil
	}
}

// dropSlot drops a slot once its walsender is gone: a contender that
// closed its connection leaves it active for a moment.
func dropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		return nil
	}
}

// shardPublication names the publication of shard k of n, and
// shardPublicationSQL creates it: the outbox rows whose aggregate id hashes
// to k (PostgreSQL 15 row filter; the same aggregate always goes to the
// same shard, so its order holds). It must exist before the WAL it decodes
// was written: pgoutput reads publications as of each change.
func shardPublication(n, k int) string { return fmt.Sprintf("walrelay_shard_%d_of_%d", k, n) }

func shardPublicationSQL(n, k int) string {
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WHERE ((hashtext(aggregateid) & 2147483647) %% %d = %d) WITH (publish = 'insert')",
		shardPublication(n, k), n, k)
}

// procStats reads a process's peak RSS (VmHWM) and CPU seconds.
func procStats(pid int) (rss int64, cpu float64) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "VmHWM:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				rss = kb * 1024
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// Fields after the command name in parentheses; utime and stime are
		// the 14th and 15th fields overall, in clock ticks (100 a second).
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+1:])
			if len(f) > 13 {
				ut, _ := strconv.ParseFloat(f[11], 64)
				st, _ := strconv.ParseFloat(f[12], 64)
				cpu = (ut + st) / 100
			}
		}
	}
	return rss, cpu
}

// profilePath, if set, receives a CPU profile of walrelay's first seconds of
// catch-up (-profile).
var profilePath string

func profile(admin, path string) {
	time.Sleep(300 * time.Millisecond)
	resp, err := http.Get("http://" + admin + "/debug/pprof/profile?seconds=3")
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = os.WriteFile(path, b, 0o644)
}

// bigTransaction measures walrelay's peak memory on one transaction of
// o.bigTxn rows: events stream through, so it should not grow with the
// transaction.
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
	x, err := walrelay(o.bin, kfakeBrokers, 1)(ctx, pg, "big", end, o.bigTxn)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "  one transaction of %d rows: %.0f events/s, peak RSS %.1f MiB\n", o.bigTxn, float64(o.bigTxn)/x.elapsed.Seconds(), float64(x.rss)/(1<<20))
	return fmt.Sprintf("### One transaction of %d rows\n\nwalrelay streamed it in %.1f s (%s events/s, including the server's decoding of the whole transaction before its first row is sent) with a peak RSS of %.1f MiB.\n",
		o.bigTxn, x.elapsed.Seconds(), human(float64(o.bigTxn)/x.elapsed.Seconds()), float64(x.rss)/(1<<20)), nil
}
