package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/longtest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/proxy"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
	"github.com/walrelay/walrelay/outbox"
)

// walrelayBin is the binary under test, built once by TestMain.
var walrelayBin string

// long marks a test as long (package longtest): skipped unless
// WALRELAY_TEST_LONG=1. Call it on a line of its own at the top of the test
// function, as long(t).
func long(t *testing.T) { t.Helper(); longtest.Skip(t) }

// defaultParallel is how many tests of this package run at once unless
// go test's -parallel says otherwise (its default is GOMAXPROCS): the tests
// here spend much of their time waiting on subprocesses, servers and
// injected faults, not on the CPU.
const defaultParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", strconv.Itoa(max(defaultParallel, runtime.GOMAXPROCS(0))))
	}
	dir, err := os.MkdirTemp("", "walrelay-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	walrelayBin = filepath.Join(dir, "walrelay")
	args := []string{"build", "-o", walrelayBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build walrelay: %v\n%s", err, out)
		os.Exit(1)
	}
	m.Run() // returning lets the deferred cleanup run; the exit code is kept
	// Only against the real broker: realBroker starts one when first called.
	if os.Getenv(kafkatest.EnvKafka) == "real" {
		if r, err := realBroker(); err == nil {
			r.Close()
		}
	}
}

// faultBin builds, once, the binary with the faultinject hooks compiled in.
var faultBin = sync.OnceValues(func() (string, error) {
	bin := walrelayBin + "-faultinject"
	args := []string{"build", "-tags", "faultinject", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build walrelay with faultinject: %v\n%s", err, out)
	}
	return bin, nil
})

// syncBuffer collects a process's output for waiting on and for failure
// reports.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a walrelay subprocess, etcd e2e style.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// env is the configuration of a walrelay under test.
type env map[string]string

func baseEnv(pg *pgtest.Server, kc *broker) env {
	kc.used = true
	return env{
		"WALRELAY_KAFKA_TOPIC":      kc.topic("{aggregatetype}"),
		"WALRELAY_KAFKA_DLQ_TOPIC":  kc.dlq(),
		"WALRELAY_POSTGRES_DSN":     pg.DSN,
		"WALRELAY_KAFKA_BROKERS":    strings.Join(kc.Addrs(), ","),
		"WALRELAY_ADMIN_LISTEN":     "",
		"WALRELAY_LOG_LEVEL":        "info",
		"WALRELAY_KAFKA_LINGER":     "2ms",
		"WALRELAY_SHUTDOWN_TIMEOUT": "20s",
	}
}

func (e env) with(kv ...string) env {
	out := env{}
	for k, v := range e {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// start runs walrelay with args and e as its only WALRELAY_ variables.
func start(t *testing.T, e env, args ...string) *proc {
	t.Helper()
	return startBin(t, walrelayBin, e, args...)
}

// startBin is start for another build of walrelay.
func startBin(t *testing.T, bin string, e env, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WALRELAY_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	for k, v := range e {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start walrelay: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("walrelay pid %d output:\n%s", p.cmd.Process.Pid, tail(p.out.String(), 6000))
		}
	})
	return p
}

// ownStacks picks from a Go runtime's goroutine dump the goroutines that
// run walrelay's code, each as its header and its functions (file lines and
// the runtime's frames dropped), so that a hang's cause fits in a test log.
func ownStacks(out string) string {
	_, dump, ok := strings.Cut(out, "\ngoroutine ")
	if !ok {
		return "(no goroutine dump in the output)"
	}
	var b strings.Builder
	for _, g := range strings.Split("goroutine "+dump, "\n\n") {
		if !strings.Contains(g, "walrelay/walrelay/") {
			continue
		}
		for _, line := range strings.Split(g, "\n") {
			if !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "runtime.") && !strings.HasPrefix(line, "internal/") {
				b.WriteString(line + "\n")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// lastLine is the last line of a process's output: walrelay's error.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// waitLog waits until the output contains s.
func (p *proc) waitLog(s string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.out.String(), s) {
		select {
		case <-p.done:
			p.t.Fatalf("walrelay exited (%v) before logging %q", p.err, s)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("walrelay did not log %q within %s", s, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// streaming starts walrelay and waits for its ready line.
func streaming(t *testing.T, e env) *proc {
	t.Helper()
	p := start(t, e, "run")
	p.waitLog("msg=streaming", 60*time.Second)
	return p
}

// exit waits for the process to end and returns its exit code. The wait
// is counted in ticks of a ticker, which drops the ticks it cannot
// deliver: a stall of the whole machine (a shared VM paused) counts as
// one tick, not as the process hanging.
func (p *proc) exit(timeout time.Duration) int {
	p.t.Helper()
	const tick = 100 * time.Millisecond
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for n := time.Duration(0); n < timeout; n += tick {
		select {
		case <-p.done:
			return p.cmd.ProcessState.ExitCode()
		case <-tk.C:
		}
	}
	select {
	case <-p.done:
	default:
		// SIGQUIT makes the Go runtime print every goroutine's stack:
		// the output (logged at the test's end) then shows where it hung.
		p.signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
		p.t.Fatalf("walrelay did not exit within %s; its goroutines in walrelay's code:\n%s", timeout, ownStacks(p.out.String()))
	}
	return p.cmd.ProcessState.ExitCode()
}

// kill sends SIGKILL and waits.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// peakRSS returns the process's peak resident set (VmHWM) in bytes.
func (p *proc) peakRSS() int64 { return p.status("VmHWM") }

// status returns a field of the process's /proc/<pid>/status given in kB
// (VmHWM, RssFile, ...), in bytes; -1 if there is none.
func (p *proc) status(field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == field+":" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return -1
}

// setup gives a test a PostgreSQL with the outbox migrated, a kfake cluster
// and a collector of every outbox and dead-letter record.
//
// With WALRELAY_TEST_KAFKA=real the tests share one Apache Kafka broker
// instead, each with topics of its own (a prefix before the default names);
// the tests that need kfake's controls skip there (broker.fake).
func setup(t *testing.T) (*pgtest.Server, *broker, *kafkatest.Collector) {
	t.Helper()
	b := newBroker(t)
	pg, col := setupWith(t, b.Addrs(), b.prefix)
	return pg, b, col
}

// needThrowaway skips a test that does something to the server itself
// (what) when the tests run against the existing server of
// WALRELAY_TEST_POSTGRES_DSN.
func needThrowaway(t *testing.T, pg *pgtest.Server, what string) {
	t.Helper()
	if pg.External() {
		t.Skip(what + ": needs a throwaway server, not the one of " + pgtest.EnvDSN)
	}
}

// broker is the Kafka of one test: its own kfake cluster, or the shared real
// broker with topics under a prefix of the test's own.
type broker struct {
	*kafkatest.Cluster          // nil against the real broker
	addrs              []string // walrelay's brokers
	prefix             string
	real               *kafkatest.Real
	network            kafkatest.Network
	used               bool // baseEnv read addrs
}

var (
	realBroker = sync.OnceValues(func() (*kafkatest.Real, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		return kafkatest.NewReal(ctx)
	})
	topicPrefixes atomic.Int64
)

func newBroker(t *testing.T) *broker {
	t.Helper()
	if os.Getenv(kafkatest.EnvKafka) != "real" {
		kc := kafkatest.Start(t)
		return &broker{Cluster: kc, addrs: kc.Addrs()}
	}
	r, err := realBroker()
	if err != nil {
		t.Fatalf("start the shared Apache Kafka broker: %v", err)
	}
	return &broker{addrs: r.Addrs(), prefix: fmt.Sprintf("t%d.", topicPrefixes.Add(1)), real: r}
}

// net returns the switches between walrelay and its broker: kfake's
// listeners, or against the real broker a listener of the test's own behind
// a proxy (walrelay bootstraps through it; the test's collector does not).
// Call it before baseEnv.
func (b *broker) net(t *testing.T) kafkatest.Network {
	t.Helper()
	if b.Cluster != nil {
		return b.Cluster
	}
	if b.network == nil {
		if b.used {
			t.Fatal("broker.net must come before baseEnv: walrelay has the direct address already")
		}
		b.addrs, b.network = b.real.Faulty(t)
	}
	return b.network
}

// Addrs returns the brokers' addresses.
func (b *broker) Addrs() []string { return b.addrs }

// topic is the test's topic for an aggregate type; dlq its dead-letter topic.
func (b *broker) topic(aggregateType string) string {
	return b.prefix + "outbox.event." + aggregateType
}
func (b *broker) dlq() string { return b.prefix + "walrelay.dlq" }

// fake returns the test's kfake cluster, or skips the test against the real
// broker: it needs kfake's controls (injecting errors into answers).
func (b *broker) fake(t *testing.T) *kafkatest.Cluster {
	t.Helper()
	if b.Cluster == nil {
		t.Skip("needs kfake's controls; not run against the real broker")
	}
	return b.Cluster
}

// setupWith is setup for the brokers at addrs, collecting the topics under
// prefix.
func setupWith(t *testing.T, addrs []string, prefix string) (*pgtest.Server, *kafkatest.Collector) {
	t.Helper()
	pg := pgtest.Start(t)
	p := start(t, env{"WALRELAY_POSTGRES_DSN": pg.DSN}, "migrate")
	if code := p.exit(60 * time.Second); code != 0 {
		t.Fatalf("migrate exited %d:\n%s", code, p.out.String())
	}
	q := regexp.QuoteMeta(prefix)
	col, err := kafkatest.Collect(addrs, q+`outbox\.event\..*|`+q+`walrelay\.dlq`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	return pg, col
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	return pgtest.Connect(t, dsn)
}

// writer writes outbox rows as an application would, remembering each
// aggregate's sequence so that order can be checked.
type writer struct {
	aggs  int
	rng   *rand.Rand
	seq   map[string]int
	ids   []string
	mu    sync.Mutex
	bytes int    // payload padding
	dsn   string // if set, a failed commit is looked up: the server may have committed it
	// prefix names the writer's aggregates (prefix + a number): writers
	// with prefixes of their own write disjoint aggregates.
	prefix string
}

func newWriter(aggs int, seed uint64) *writer {
	return &writer{aggs: aggs, rng: rand.New(rand.NewPCG(seed, 1)), seq: map[string]int{}, prefix: "agg-"}
}

// txn writes n rows in one transaction; the rows count only if it commits.
func (w *writer) txn(ctx context.Context, conn *pgx.Conn, n int) error {
	type row struct {
		id, agg, payload string
		seq              int
	}
	rows := make([]row, n)
	next := map[string]int{}
	for i := range rows {
		agg := fmt.Sprintf("%s%d", w.prefix, w.rng.IntN(w.aggs))
		s, ok := next[agg]
		if !ok {
			s = w.seq[agg]
		}
		next[agg] = s + 1
		rows[i] = row{id: outbox.NewID(), agg: agg, seq: s,
			payload: fmt.Sprintf(`{"agg": %q, "seq": %d, "pad": %q}`, agg, s, strings.Repeat("x", w.bytes))}
	}
	batch := &pgx.Batch{}
	for _, r := range rows {
		batch.Queue("INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'OrderUpdated', $3)", r.id, r.agg, r.payload)
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return tx.SendBatch(ctx, batch).Close() })
	if err != nil && w.dsn != "" {
		// The connection may have died after the server committed: ask.
		committed, rerr := resolveCommit(ctx, w.dsn, rows[0].id)
		if rerr != nil {
			return fmt.Errorf("%w (and whether it committed is unknown: %w)", err, rerr)
		}
		if committed {
			err = nil
		}
	}
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range rows {
		w.ids = append(w.ids, r.id)
	}
	for agg, s := range next {
		w.seq[agg] = s
	}
	return nil
}

// writeInBackground writes 3-row transactions to dsn without pause until
// the returned stop is called, connecting again after an error (a commit
// whose answer was lost counts if w.dsn is set and the row is there). It
// stops at a flag, not by a cancelled context: a commit cut by a cancel
// could be counted as failed and yet be committed. stop returns how many
// transactions failed.
func (w *writer) writeInBackground(ctx context.Context, dsn string) (stop func() int) {
	var done atomic.Bool
	var wg sync.WaitGroup
	failed := 0
	wg.Go(func() {
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for !done.Load() && ctx.Err() == nil {
			if conn == nil {
				c, err := pgx.Connect(ctx, dsn)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				conn = c
			}
			if err := w.txn(ctx, conn, 3); err != nil {
				failed++
				conn.Close(context.Background())
				conn = nil
			}
		}
	})
	return func() int {
		done.Store(true)
		wg.Wait()
		return failed
	}
}

// write writes total rows in transactions of 1 to maxTxn rows.
func (w *writer) write(ctx context.Context, conn *pgx.Conn, total, maxTxn int) error {
	for done := 0; done < total; {
		n := min(1+w.rng.IntN(maxTxn), total-done)
		if err := w.txn(ctx, conn, n); err != nil {
			return fmt.Errorf("write rows %d to %d: %w", done, done+n, err)
		}
		done += n
	}
	return nil
}

// resolveCommit reports whether the row id exists, connecting afresh (the
// server may be restarting) for up to a minute.
func resolveCommit(ctx context.Context, dsn, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id = $1", id).Scan(&n)
			conn.Close(context.Background())
			if err == nil {
				return n > 0, nil
			}
		}
		select {
		case <-ctx.Done():
			return false, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (w *writer) written() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ids...)
}

// committedIDs reads the ground truth: every id in the outbox table.
func committedIDs(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	return texts(t, conn, "SELECT id::text FROM outbox")
}

// texts returns the text column that query selects.
func texts(t *testing.T, conn *pgx.Conn, query string) []string {
	t.Helper()
	rows, err := conn.Query(t.Context(), query)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// tally is what arrived on the outbox topics for a set of expected ids.
type tally struct {
	records, distinct, missing, unexpected, duplicates, orderViolations int
}

func (c tally) String() string {
	return fmt.Sprintf("records=%d distinct=%d missing=%d unexpected=%d duplicates=%d order_violations=%d",
		c.records, c.distinct, c.missing, c.unexpected, c.duplicates, c.orderViolations)
}

// count tallies records against want. Order: per key, the first delivery of
// each event must come in sequence order (replays after a crash may repeat
// earlier events, which are duplicates, not violations).
func count(recs []*kgo.Record, want []string) tally {
	wantSet := make(map[string]bool, len(want))
	for _, id := range want {
		wantSet[id] = true
	}
	sorted := inLogOrder(recs)
	c := tally{records: len(sorted)}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, r := range sorted {
		id := string(kafkatest.Header(r, "id"))
		if seen[id] {
			c.duplicates++
			continue
		}
		seen[id] = true
		if !wantSet[id] {
			c.unexpected++
			continue
		}
		c.distinct++
		if s, ok := seqOf(r.Value); ok {
			key := string(r.Key)
			if prev, ok := last[key]; ok && s != prev+1 {
				c.orderViolations++
			}
			last[key] = s
		}
	}
	c.missing = len(wantSet) - c.distinct
	return c
}

// inLogOrder returns the records of the outbox topics sorted by topic,
// partition and offset.
func inLogOrder(recs []*kgo.Record) []*kgo.Record {
	sorted := make([]*kgo.Record, 0, len(recs))
	for _, r := range recs {
		if strings.Contains(r.Topic, "outbox.event.") {
			sorted = append(sorted, r)
		}
	}
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return sorted
}

// seqOf reads "seq" from a writer payload (jsonb normalizes the spacing).
func seqOf(v []byte) (int, bool) {
	i := bytes.Index(v, []byte(`"seq": `))
	if i < 0 {
		return 0, false
	}
	j := i + len(`"seq": `)
	k := j
	for k < len(v) && v[k] >= '0' && v[k] <= '9' {
		k++
	}
	n, err := strconv.Atoi(string(v[j:k]))
	return n, err == nil
}

// waitAll waits until every id in want arrived.
func waitAll(t *testing.T, col *kafkatest.Collector, want []string, timeout time.Duration) tally {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	recs, err := col.Wait(ctx, func(recs []*kgo.Record) bool { return count(recs, want).missing == 0 })
	c := count(recs, want)
	if err != nil {
		t.Fatalf("not every event arrived: %s: %v", c, err)
	}
	return c
}

// slotConfirmed reads the slot's confirmed_flush_lsn.
func slotConfirmed(t *testing.T, conn *pgx.Conn, slot string) string {
	t.Helper()
	var lsn string
	if err := conn.QueryRow(t.Context(), "SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// pgProxy puts a TCP proxy in front of the test's server and returns it
// with a DSN through it.
func pgProxy(t *testing.T, pg *pgtest.Server) (*proxy.Proxy, string) {
	t.Helper()
	needThrowaway(t, pg, "uses the server's port")
	px, err := proxy.New(fmt.Sprintf("127.0.0.1:%d", pg.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return px, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", px.Addr())
}

// pendingChanges reports whether the slot, read through pub, still has a
// change to send: it was not confirmed past the last transaction.
func pendingChanges(t *testing.T, conn *pgx.Conn, slot, pub string) bool {
	t.Helper()
	// The server releases the slot a moment after walrelay exits; peeking
	// needs it released.
	waitSlotInactive(t, conn, slot)
	var pending bool
	if err := conn.QueryRow(t.Context(), `SELECT count(*) > 0 FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, pub).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	return pending
}

// waitSlotInactive waits until no process streams the slot.
func waitSlotInactive(t *testing.T, conn *pgx.Conn, slot string) {
	t.Helper()
	waitfor.Until(t, time.Minute, "slot "+slot+" to be inactive", func() bool {
		var active bool
		err := conn.QueryRow(t.Context(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && !active
	})
}

// waitSent waits until the walsender of walrelay's slot has sent the WAL up
// to the server's current position: walrelay has read (or holds in its
// socket) everything written so far.
func waitSent(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	var end string
	if err := conn.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, time.Minute, "the walsender to send up to "+end, func() bool {
		var sent bool
		err := conn.QueryRow(t.Context(), `SELECT coalesce(bool_or(r.sent_lsn >= $1::pg_lsn), false) FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'walrelay'`, end).Scan(&sent)
		return err == nil && sent
	})
}

// createTopic creates a topic with Partitions partitions, the brokers'
// default replication factor (1 on one broker, 3 on a RealCluster) and the
// given topic configs.
func createTopic(t *testing.T, addrs []string, name string, configs map[string]string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, kafkatest.Partitions, -1
	for k, v := range configs {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	for _, r := range resp.Topics {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
}

// alterTopic sets one config of a topic.
func alterTopic(t *testing.T, addrs []string, name, key, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, name
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value, c.Op = key, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatalf("alter topic %s: %v", name, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("alter topic %s: %v", name, err)
		}
	}
}
