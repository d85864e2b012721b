// Command walrelay-bench measures walrelay against the one-slot limit, side
// by side in one run: it loads outbox rows into a throwaway PostgreSQL once
// behind a template slot, copies that slot for each contender so that every
// one streams exactly the same WAL range, and times
//
//   - server-side decoding alone (pg_logical_slot_peek_binary_changes),
//   - pg_recvlogical (pgoutput, proto 1) to /dev/null,
//   - a raw Go receiver that only runs pglogrepl.Parse: the decode limit,
//   - walrelay (the binary, as a subprocess) into an in-process kfake,
//     timed until the slot's confirmed_flush_lsn reaches the end LSN, which
//     it confirms only after Kafka acknowledged every event,
//   - with -shards N, walrelay as N processes, each on its own slot and a
//     publication whose row filter takes the aggregates that hash to it,
//     until every slot reaches the end,
//
// then commit-to-ack latency at fixed offered rates. It prints a Markdown
// table whose ratios come from the same run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "walrelay-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	events   int
	payload  int
	shapes   []int // rows per transaction, one data set each
	runs     int
	rates    []rate // offered loads for the latency runs
	duration time.Duration
	bin      string
	svg      string
	// realKafka adds walrelay into a real Apache Kafka broker to the
	// catch-up tables.
	realKafka bool
	// kafkaCluster adds walrelay into a three-node Apache Kafka cluster.
	kafkaCluster bool
	// debezium adds Debezium into that broker (it implies realKafka).
	debezium bool
	// exactlyOnce adds walrelay in exactly-once mode, with Kafka
	// transactions every txnInterval.
	exactlyOnce bool
	txnInterval time.Duration
	inboxEvents int // records of the inbox benchmark; 0: skip
	pollEvents  int // rows of the poll-vs-WAL comparison; 0: skip
	// shards, above 1, adds walrelay sharded across that many slots.
	shards int
	bigTxn int
	// registry adds walrelay with kafka.key_format and value_format avro,
	// against a real Apicurio Registry that the bench starts (registry.go).
	registry bool
	// registryURL is that registry's, once started.
	registryURL string

	latencyProfile string
	// variants adds walrelay into kfake (and in exactly-once mode, with
	// exactlyOnce) with each of these settings (WALRELAY_ variables),
	// beside the default, in the catch-up tables and the large
	// transaction: their runs interleave with the default's, so that a
	// loaded machine weighs on each alike.
	variants [][]string
}

func run() error {
	var o options
	var shapes, rates, variants string
	flag.IntVar(&o.events, "events", 200000, "outbox rows per data set")
	flag.IntVar(&o.payload, "payload", 300, "payload bytes per row")
	flag.StringVar(&shapes, "rows-per-txn", "100,1", "data sets: rows per transaction, comma-separated")
	flag.IntVar(&o.runs, "runs", 3, "runs of each contender; the median is quoted")
	flag.StringVar(&rates, "rates", "1000,2000,5000,10000x10,20000x10,0", "offered loads for the latency runs: events per second, xN for N-row transactions, 0 for unpaced writers (empty: skip)")
	flag.StringVar(&o.latencyProfile, "latency-profile", "", "write a CPU profile of walrelay during the first latency load to this file")
	flag.IntVar(&o.bigTxn, "big-txn", 1000000, "rows of the one large transaction whose catch-up memory is measured (0: skip)")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "length of each latency run")
	flag.StringVar(&o.bin, "walrelay", "", "the walrelay binary (default: built from ./cmd/walrelay)")
	flag.BoolVar(&o.realKafka, "real-kafka", false, "also time walrelay into a real Apache Kafka broker (fetched from Maven Central on first use; needs Java 17)")
	flag.BoolVar(&o.kafkaCluster, "kafka-cluster", false, "also time walrelay into a three-node Apache Kafka cluster (replication factor 3, min.insync.replicas 2, on the same cores)")
	flag.BoolVar(&o.debezium, "debezium", false, "also time Debezium's PostgreSQL connector with the outbox event router into the real broker (implies -real-kafka)")
	flag.BoolVar(&o.exactlyOnce, "exactly-once", false, "also time walrelay in exactly-once mode (kafka.exactly_once), into kfake and, with -real-kafka, into the real broker")
	flag.DurationVar(&o.txnInterval, "txn-interval", 10*time.Millisecond, "kafka.transaction_interval of the exactly-once runs")
	flag.IntVar(&o.shards, "shards", 0, "also time walrelay sharded across this many slots and row-filtered publications, one process each (0 or 1: not)")
	flag.IntVar(&kfakeBrokerCount, "kfake-brokers", 1, "brokers of each kfake cluster (its partitions are spread over them)")
	flag.BoolVar(&o.registry, "registry", false, "also time walrelay with kafka.key_format and value_format avro (the JSON payload expanded, schemas registered in a real Apicurio Registry "+registrytest.Version+" that the bench starts: fetched from Maven Central on first use, needs Java 17), into kfake, beside the raw format")
	flag.StringVar(&o.svg, "svg", "", "write a plot of latency against offered load to this file")
	flag.IntVar(&o.inboxEvents, "inbox", 0, "also time package inbox against a plain consumer on this many records (0: skip)")
	flag.IntVar(&o.pollEvents, "poll", 0, "also compare the poll source with the WAL source on this many rows, per data set of -rows-per-txn (0: skip)")
	flag.StringVar(&profilePath, "profile", "", "write a CPU profile of walrelay's catch-up (the first data set) to this file")
	flag.StringVar(&variants, "variants", "", "also time walrelay into kfake with each of these settings, interleaved with the default's runs: space-separated variants, each of comma-separated WALRELAY_ variables (WALRELAY_MEMORY_LIMIT=33554432,WALRELAY_KAFKA_MAX_BUFFERED_BYTES=8388608)")
	replotFrom := flag.String("replot", "", "only draw -svg again from the latency table of an earlier run's output")
	flag.Parse()
	if *replotFrom != "" {
		points, err := replot(*replotFrom)
		if err != nil {
			return err
		}
		if o.svg == "" {
			return fmt.Errorf("-replot needs -svg")
		}
		return os.WriteFile(o.svg, []byte(plot(points)), 0o644)
	}
	o.realKafka = o.realKafka || o.debezium
	var err error
	if o.shapes, err = ints(shapes); err != nil {
		return fmt.Errorf("-rows-per-txn: %w", err)
	}
	for _, v := range strings.Fields(variants) {
		kvs := strings.Split(v, ",")
		for _, kv := range kvs {
			if k, _, ok := strings.Cut(kv, "="); !ok || !strings.HasPrefix(k, "WALRELAY_") {
				return fmt.Errorf("-variants: %q is not WALRELAY_NAME=value", kv)
			}
		}
		o.variants = append(o.variants, kvs)
	}
	if o.rates, err = parseRates(rates); err != nil {
		return fmt.Errorf("-rates: %w", err)
	}
	if o.bin == "" {
		dir, err := os.MkdirTemp("", "walrelay-bench")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.bin = filepath.Join(dir, "walrelay")
		if out, err := exec.Command("go", "build", "-o", o.bin, "./cmd/walrelay").CombinedOutput(); err != nil {
			return fmt.Errorf("build walrelay (run from the repository root, or pass -walrelay): %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	defer func() {
		if realRuns.Load() > 0 { // started: realKafka would start one otherwise
			if r, err := realKafka(); err == nil {
				r.Close()
			}
		}
		if clusterRuns.Load() > 0 {
			if c, err := realCluster(); err == nil {
				c.Close()
			}
		}
	}()
	if o.registry {
		stop, err := startRegistry(ctx, &o)
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Printf("walrelay-bench: %d events of %d-byte payloads per data set, %d runs each, on %d cores\n\n", o.events, o.payload, o.runs, numCPU())
	var tables []string
	for _, rows := range o.shapes {
		t, err := catchUp(ctx, o, rows)
		if err != nil {
			return fmt.Errorf("data set of %d rows per transaction: %w", rows, err)
		}
		tables = append(tables, t)
	}
	if o.pollEvents > 0 {
		for _, rows := range o.shapes {
			t, err := pollBench(ctx, o, rows)
			if err != nil {
				return fmt.Errorf("poll: %w", err)
			}
			tables = append(tables, t)
		}
	}
	if o.inboxEvents > 0 {
		t, err := inboxBench(ctx, o)
		if err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		tables = append(tables, t)
	}
	if o.bigTxn > 0 {
		t, err := bigTransaction(ctx, o)
		if err != nil {
			return fmt.Errorf("large transaction: %w", err)
		}
		tables = append(tables, t)
	}
	for _, t := range tables {
		fmt.Println(t)
	}
	if len(o.rates) > 0 {
		t, points, err := latency(ctx, o, false)
		if err != nil {
			return fmt.Errorf("latency: %w", err)
		}
		fmt.Println(t)
		if o.svg != "" {
			if err := os.WriteFile(o.svg, []byte(plot(points)), 0o644); err != nil {
				return err
			}
		}
		if o.exactlyOnce {
			t, _, err := latency(ctx, o, true)
			if err != nil {
				return fmt.Errorf("latency, exactly-once: %w", err)
			}
			fmt.Println(t)
		}
	}
	return nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// rate is an offered load: events per second in transactions of rows rows.
type rate struct{ events, rows int }

func parseRates(s string) ([]rate, error) {
	var out []rate
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ev, rows, ok := strings.Cut(f, "x")
		if !ok {
			rows = "1"
		}
		if ev == "0" {
			out = append(out, rate{0, 1})
			continue
		}
		n, err := ints(ev + "," + rows)
		if err != nil || len(n) != 2 {
			return nil, fmt.Errorf("%q: want events/s, or events/s x rows per transaction", f)
		}
		out = append(out, rate{n[0], n[1]})
	}
	return out, nil
}

// stats are the median, min and max of a set of measurements.
type stats struct{ med, lo, hi float64 }

func summarize(xs []float64) stats {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return stats{med: s[len(s)/2], lo: s[0], hi: s[len(s)-1]}
}

func (s stats) String() string {
	return fmt.Sprintf("%s (%s to %s)", human(s.med), human(s.lo), human(s.hi))
}

func human(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.1fk", x/1e3)
	default:
		return fmt.Sprintf("%.1f", x)
	}
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}
