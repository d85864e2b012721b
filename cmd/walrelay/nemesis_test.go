package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// nemesisStep is one fault of a nemesis schedule, given the leader of a
// partition picked at random (the victim); it returns once the fault is
// over.
type nemesisStep struct {
	// leader: the step takes the victim's leadership away (the
	// cluster's failover is measured beside walrelay's stall).
	leader bool
	do     func(t *testing.T, nc *nemesisCtx, n *kafkatest.Node)
}

// nemesisCtx is what a step acts on.
type nemesisCtx struct {
	kc    *kafkatest.RealCluster
	topic string
	rng   *rand.Rand
}

// nemesisSteps are the faults a schedule draws from. add_partitions is
// drawn at most once per stream: a key may then be in two partitions, never
// three.
var nemesisSteps = map[string]nemesisStep{
	"add_partitions": {false, func(t *testing.T, nc *nemesisCtx, _ *kafkatest.Node) {
		adm, done := nemesisAdmin(t, nc.kc)
		defer done()
		ctx := t.Context()
		// Asked again while a node does not answer; an earlier try whose
		// answer was lost may have added them already.
		want := kafkatest.Partitions + 3
		waitfor.NoError(t, time.Minute, "add partitions to "+nc.topic, func() error {
			resp, err := adm.UpdatePartitions(ctx, want, nc.topic)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				if md, merr := adm.Metadata(ctx, nc.topic); merr == nil && len(md.Topics[nc.topic].Partitions) == want {
					return nil
				}
			}
			return err
		})
		time.Sleep(8 * time.Second)
	}},
	"leader_killed": {true, func(t *testing.T, nc *nemesisCtx, n *kafkatest.Node) {
		n.Kill()
		time.Sleep(5 * time.Second)
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}},
	"leader_frozen": {true, func(t *testing.T, nc *nemesisCtx, n *kafkatest.Node) {
		if err := n.Freeze(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		if err := n.Thaw(); err != nil {
			t.Fatal(err)
		}
	}},
	"node_slow": {false, func(t *testing.T, nc *nemesisCtx, n *kafkatest.Node) {
		n.Slow(300 * time.Millisecond)
		time.Sleep(8 * time.Second)
		n.Slow(0)
	}},
	"node_cut": {true, func(t *testing.T, nc *nemesisCtx, n *kafkatest.Node) {
		n.Cut()
		time.Sleep(10 * time.Second)
		n.Mend()
	}},
	// The replicas of every partition rotated (a reassignment that keeps
	// the same nodes), then a preferred-leader election: every leader
	// moves, the nodes all up.
	"leaders_moved": {false, func(t *testing.T, nc *nemesisCtx, _ *kafkatest.Node) {
		adm, done := nemesisAdmin(t, nc.kc)
		defer done()
		ctx := t.Context()
		// Each request asked again while a node does not answer (a node
		// restarted by the step before may still be starting): both are
		// idempotent.
		var md kadm.Metadata
		waitfor.NoError(t, time.Minute, "the metadata of "+nc.topic, func() (err error) {
			md, err = adm.Metadata(ctx, nc.topic)
			return err
		})
		var req kadm.AlterPartitionAssignmentsReq
		for _, p := range md.Topics[nc.topic].Partitions {
			r := slices.Clone(p.Replicas)
			if len(r) > 1 {
				r = append(r[1:], r[0])
			}
			req.Assign(nc.topic, p.Partition, r)
		}
		waitfor.NoError(t, time.Minute, "reassign "+nc.topic, func() error {
			resp, err := adm.AlterPartitionAssignments(ctx, req)
			if err == nil {
				err = resp.Error()
			}
			return err
		})
		time.Sleep(time.Second)
		// A partition whose leader is its preferred one already answers
		// ELECTION_NOT_NEEDED: not a failure.
		waitfor.NoError(t, time.Minute, "elect the preferred leaders of "+nc.topic, func() error {
			_, err := adm.ElectLeaders(ctx, kadm.ElectPreferredReplica, kadm.TopicsSet{nc.topic: nil})
			return err
		})
		time.Sleep(5 * time.Second)
	}},
	"rolling_restart": {false, func(t *testing.T, nc *nemesisCtx, _ *kafkatest.Node) {
		for _, n := range nc.kc.Nodes {
			if err := n.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := n.Start(); err != nil {
				t.Fatal(err)
			}
			if err := nc.kc.WaitHealthy(t.Context(), nil); err != nil {
				t.Fatal(err)
			}
		}
	}},
}

func nemesisAdmin(t *testing.T, kc *kafkatest.RealCluster) (*kadm.Client, func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	return kadm.NewClient(cl), cl.Close
}

// TestKafkaNemesis streams rows, each with a sequence number per key, into
// a three-node Apache Kafka cluster while a schedule of faults applies, one
// after another: partitions added to the outbox topic, a leader killed
// (SIGKILL) and started again, a leader frozen (SIGSTOP) for 10 s, a node's
// answers 300 ms late for 8 s, a node cut off the network for 10 s, every
// partition's replicas rotated and the preferred leaders elected (every
// leader moves), and a rolling restart; in at-least-once mode and in
// exactly-once mode, on one cluster (fast fencing, 4 s). Then it is judged
// from outside, by Kafka's own console consumer with --isolation-level
// read_committed, printing partition, offset, key and headers: every
// committed row present (in exactly-once mode, once); per key, within each
// partition, the sequence increasing (a replay's repeats of earlier rows
// aside); each key in at most two partitions, and never back in the old
// one after the new (every row in its old partition before every row only
// in its new one). It logs, per step, the longest stall of the slot's
// confirmed position and the cluster's own failover.
//
// By default a short fixed schedule runs (.ci/run); WALRELAY_TEST_NEMESIS_SEED
// set to a number draws a random one of WALRELAY_TEST_NEMESIS_STEPS steps (10
// unless set) per mode from that seed, which is printed: the same seed
// runs the same schedule again. It needs the cluster:
// WALRELAY_TEST_KAFKA_CLUSTER=1.
func TestKafkaNemesis(t *testing.T) {
	if os.Getenv("WALRELAY_TEST_KAFKA_CLUSTER") == "" {
		t.Skip("starts a three-node Apache Kafka cluster: set WALRELAY_TEST_KAFKA_CLUSTER=1 (.ci/run does)")
	}
	schedules := map[string][]string{
		"at_least_once": {"add_partitions", "leader_killed", "leaders_moved", "node_slow"},
		"exactly_once":  {"leader_frozen", "add_partitions", "node_cut", "leaders_moved"},
	}
	seed := uint64(0)
	if s := os.Getenv("WALRELAY_TEST_NEMESIS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("WALRELAY_TEST_NEMESIS_SEED: %v", err)
		}
		steps := 10
		if s := os.Getenv("WALRELAY_TEST_NEMESIS_STEPS"); s != "" {
			if steps, err = strconv.Atoi(s); err != nil {
				t.Fatalf("WALRELAY_TEST_NEMESIS_STEPS: %v", err)
			}
		}
		rng := rand.New(rand.NewPCG(seed, 2))
		names := slices.Sorted(func(yield func(string) bool) {
			for k := range nemesisSteps {
				if !yield(k) {
					return
				}
			}
		})
		for _, mode := range []string{"at_least_once", "exactly_once"} { // in order: one seed, one schedule
			var s []string
			added := false
			for len(s) < steps {
				n := names[rng.IntN(len(names))]
				if n == "add_partitions" {
					if added {
						continue
					}
					added = true
				}
				s = append(s, n)
			}
			schedules[mode] = s
		}
	}
	t.Logf("nemesis: seed %d (WALRELAY_TEST_NEMESIS_SEED=%d runs these schedules again); at_least_once %v; exactly_once %v", seed, seed, schedules["at_least_once"], schedules["exactly_once"])
	kc := kafkatest.StartRealCluster(t, kafkatest.FastFencing)
	for _, mode := range []string{"at_least_once", "exactly_once"} {
		t.Run(mode, func(t *testing.T) { nemesis(t, kc, mode, schedules[mode], seed) })
	}
}

// nemesis runs one schedule in mode against kc and judges it.
func nemesis(t *testing.T, kc *kafkatest.RealCluster, mode string, schedule []string, seed uint64) {
	prefix := "nemesis." + mode + "."
	topic := prefix + "outbox.event.order"
	createTopic(t, kc.Addrs(), topic, nil)
	pg, col := setupWith(t, kc.Addrs(), prefix)
	ctx := t.Context()
	e := clusterEnv(kc, pg.DSN, prefix)
	e["WALRELAY_KAFKA_REQUEST_TIMEOUT"] = "2s"
	if mode == "exactly_once" {
		e["WALRELAY_KAFKA_EXACTLY_ONCE"] = "true"
		e["WALRELAY_KAFKA_OFFSETS_TOPIC"] = prefix + "walrelay.offsets"
	}
	p := streaming(t, e)
	conn := connect(t, pg.DSN)
	w := newWriter(40, seed+7)
	w.dsn = pg.DSN
	w.bytes = 1000 // a lane's round after a stall holds megabytes: several batches of a partition
	if err := w.write(ctx, conn, 200, 5); err != nil {
		t.Fatal(err)
	}
	if err := kc.WaitHealthy(ctx, []string{topic}); err != nil {
		t.Fatal(err)
	}
	stopWriting := w.writeInBackground(ctx, pg.DSN)
	var stall atomic.Int64 // the longest stall of the step under way, ns
	var stop atomic.Bool
	var wg sync.WaitGroup
	mc := connect(t, pg.DSN)
	wg.Go(func() {
		var last string
		moved := time.Now()
		for !stop.Load() {
			var lsn string
			if err := mc.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'walrelay'").Scan(&lsn); err == nil && lsn != last {
				last, moved = lsn, time.Now()
			}
			if d := int64(time.Since(moved)); d > stall.Load() {
				stall.Store(d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	nc := &nemesisCtx{kc: kc, topic: topic, rng: rand.New(rand.NewPCG(seed, 3))}
	var worst time.Duration
	unmoved := 0 // leader steps whose leadership the cluster did not move
	for i, name := range schedule {
		step := nemesisSteps[name]
		time.Sleep(2 * time.Second)
		stall.Store(0)
		began := time.Now()
		// The victim: the leader of a partition picked at random.
		part := int32(nc.rng.IntN(kafkatest.Partitions))
		victim, err := kc.Leader(ctx, topic, part)
		if err != nil {
			t.Fatal(err)
		}
		// The cluster's own failover: until its metadata names another
		// leader of that partition, looked for while the fault lasts (if
		// it did not move by then, it does not: walrelay can only wait
		// for the fault's end). A step that takes no leader has none.
		failover := make(chan time.Duration, 1)
		fctx, stopLooking := context.WithCancel(ctx)
		if step.leader {
			go func() {
				d, err := kc.LeaderMoved(fctx, topic, part, victim.ID)
				if err != nil {
					d = -1
				}
				failover <- d
			}()
		} else {
			failover <- 0
		}
		step.do(t, nc, victim)
		fault := time.Since(began)
		stopLooking()
		if err := kc.WaitHealthy(ctx, []string{topic}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		s, f := time.Duration(stall.Load()), <-failover
		ref, what := f, fmt.Sprintf("the cluster's failover %s", f.Round(10*time.Millisecond))
		switch {
		case !step.leader:
			what = "no failover"
		case f < 0:
			ref, what = fault, fmt.Sprintf("the cluster did not move the leadership during the fault (%s)", fault.Round(100*time.Millisecond))
			unmoved++
		}
		past := max(s-ref, 0)
		worst = max(worst, past)
		t.Logf("nemesis %s step %d %s (victim node %d, partition %d): took %s; longest stall of the slot's confirmed position %s; %s; %s past it",
			mode, i+1, name, victim.ID, part, time.Since(began).Round(100*time.Millisecond), s.Round(10*time.Millisecond), what, past.Round(10*time.Millisecond))
		// A walrelay that stopped is a stall that never ends: said at
		// once, with its last lines (the cleanup prints them), rather than
		// as rows missing minutes later.
		select {
		case <-p.done:
			t.Fatalf("nemesis %s step %d %s: walrelay exited (%v)", mode, i+1, name, p.err)
		default:
		}
	}
	stop.Store(true)
	wg.Wait()
	if failed := stopWriting(); failed != 0 {
		t.Logf("%d transactions failed to commit (counted only if committed)", failed)
	}
	want := committedIDs(t, conn)
	// Until every row arrived, as a plain consumer sees it (the judge is
	// the console consumer, below).
	waitAll(t, col, want, 3*time.Minute)
	t.Logf("nemesis %s: walrelay's warnings and errors: %s", mode, warnings(p.out.String()))
	p.signal(syscall.SIGTERM)
	if code := p.exit(time.Minute); code != 0 {
		t.Fatalf("walrelay exited %d", code)
	}
	out := consoleConsumer(t, []string{"--bootstrap-server", kc.Addrs()[0], "--topic", topic, "--from-beginning",
		"--formatter-property", "print.partition=true", "--formatter-property", "print.offset=true",
		"--formatter-property", "print.headers=true", "--formatter-property", "print.key=true"})
	j := judge(out, want, mode == "exactly_once")
	t.Logf("nemesis %s: %d steps %v; %d rows committed; the console consumer printed %d records; %s; longest stall past the cluster's failover (or the fault's end, or the step's start) %s; leader faults the cluster did not fail over %d",
		mode, len(schedule), schedule, len(want), j.records, j, worst.Round(10*time.Millisecond), unmoved)
	if j.violations() != 0 {
		t.Fatalf("nemesis %s: %s; the first of them:\n%s", mode, j, strings.Join(j.first, "\n"))
	}
}

// verdict is what the judge found.
type verdict struct {
	records, missing, duplicates int
	// orderViolations: a key's sequence not increasing within a partition;
	// threePartitions: a key in more than two partitions; backInOld: a row
	// of a key in its old partition after one only in its new one.
	orderViolations, threePartitions, backInOld, moved int
	first                                              []string
	once                                               bool // exactly-once mode: duplicates count
}

// violations counts what breaks walrelay's promises; duplicates only in
// exactly-once mode.
func (v verdict) violations() int {
	n := v.missing + v.orderViolations + v.threePartitions + v.backInOld
	if v.once {
		n += v.duplicates
	}
	return n
}

func (v verdict) String() string {
	return fmt.Sprintf("missing=%d duplicates=%d order_violations=%d keys_in_3+_partitions=%d back_in_old_partition=%d keys_moved=%d",
		v.missing, v.duplicates, v.orderViolations, v.threePartitions, v.backInOld, v.moved)
}

func (v *verdict) note(format string, args ...any) {
	if len(v.first) < 5 {
		v.first = append(v.first, fmt.Sprintf(format, args...))
	}
}

// consoleLine is one record as the console consumer prints it with
// print.partition, print.offset, print.headers and print.key:
// "Partition:P\tOffset:O\th1:v1,h2:v2\tkey\tvalue".
var consoleLine = regexp.MustCompile(`(?m)^Partition:(\d+)\tOffset:(\d+)\t([^\t]*)\t([^\t]*)\t(.*)$`)

// judge checks the console consumer's output against the committed ids;
// once: each must be there once (exactly-once mode).
func judge(out string, want []string, once bool) verdict {
	type rec struct {
		partition, offset int
		id, key           string
		seq               int
	}
	var v verdict
	byKey := map[string][]rec{}
	count := map[string]int{}
	idRe := regexp.MustCompile(`(?:^|,)id:([0-9a-f-]{36})`)
	for _, m := range consoleLine.FindAllStringSubmatch(out, -1) {
		part, _ := strconv.Atoi(m[1])
		off, _ := strconv.Atoi(m[2])
		id := ""
		if im := idRe.FindStringSubmatch(m[3]); im != nil {
			id = im[1]
		}
		seq, ok := seqOf([]byte(m[5]))
		if !ok {
			seq = -1
		}
		v.records++
		count[id]++
		byKey[m[4]] = append(byKey[m[4]], rec{part, off, id, m[4], seq})
	}
	for _, id := range want {
		if count[id] == 0 {
			v.missing++
			v.note("row %s missing", id)
		}
	}
	for _, n := range count {
		v.duplicates += n - 1
	}
	for key, rs := range byKey {
		slices.SortFunc(rs, func(a, b rec) int {
			if a.partition != b.partition {
				return a.partition - b.partition
			}
			return a.offset - b.offset
		})
		parts := map[int]map[string]bool{} // partition -> ids
		for _, r := range rs {
			if parts[r.partition] == nil {
				parts[r.partition] = map[string]bool{}
			}
			parts[r.partition][r.id] = true
		}
		if len(parts) > 2 {
			v.threePartitions++
			v.note("key %s in %d partitions", key, len(parts))
			continue
		}
		// inOther: the id is in the key's other partition too (a replay
		// of rows its old partition holds, into its new one).
		inOther := func(r rec) bool {
			for p, ids := range parts {
				if p != r.partition && ids[r.id] {
					return true
				}
			}
			return false
		}
		// Within each partition, skipping repeats (a replay) and rows
		// also in the other partition, the sequence increases.
		lowest := map[int]int{}  // partition -> lowest seq
		highest := map[int]int{} // partition -> highest seq
		onlyLow := map[int]int{} // partition -> lowest seq of rows only there
		seen := map[string]bool{}
		last, lastPart := -1, -1
		for _, r := range rs {
			if r.partition != lastPart {
				last, lastPart = -1, r.partition
				lowest[r.partition], highest[r.partition], onlyLow[r.partition] = r.seq, r.seq, -1
			}
			lowest[r.partition] = min(lowest[r.partition], r.seq)
			highest[r.partition] = max(highest[r.partition], r.seq)
			other := inOther(r)
			if !other && (onlyLow[r.partition] < 0 || r.seq < onlyLow[r.partition]) {
				onlyLow[r.partition] = r.seq
			}
			if seen[r.id] || other {
				seen[r.id] = true
				continue
			}
			seen[r.id] = true
			if r.seq <= last {
				v.orderViolations++
				v.note("key %s partition %d: seq %d at offset %d after seq %d", key, r.partition, r.seq, r.offset, last)
			}
			last = r.seq
		}
		if len(parts) == 2 {
			v.moved++
			var ps []int
			for p := range parts {
				ps = append(ps, p)
			}
			old, nw := ps[0], ps[1]
			if lowest[nw] < lowest[old] {
				old, nw = nw, old
			}
			if onlyLow[nw] >= 0 && highest[old] > onlyLow[nw] {
				v.backInOld++
				v.note("key %s: seq %d in its old partition %d, after seq %d in its new partition %d", key, highest[old], old, onlyLow[nw], nw)
			}
		}
	}
	v.once = once
	return v
}

// TestNemesisJudge: the nemesis's judge finds each kind of violation in
// console consumer output, and lets through what at-least-once allows (a
// replay's repeats, a key's one move).
func TestNemesisJudge(t *testing.T) {
	t.Parallel()
	id := func(n int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", n) }
	// line prints row n (key k, sequence seq) at partition p, offset o.
	type row struct{ p, o, n int }
	seqs := map[int]int{} // row -> seq, in the key "k"
	out := func(rows ...row) string {
		var b strings.Builder
		b.WriteString("[2026-12-06 02:00:00,000] WARN something the tool logs\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "Partition:%d\tOffset:%d\tid:%s,walrelay.commit_time:2026-12-06T02:00:00Z\tk\t{\"agg\": \"k\", \"seq\": %d, \"pad\": \"\"}\n", r.p, r.o, id(r.n), seqs[r.n])
		}
		b.WriteString("Processed a total of 9 messages\n")
		return b.String()
	}
	for n := range 10 {
		seqs[n] = n
	}
	all := func(n int) []string {
		var ids []string
		for i := range n {
			ids = append(ids, id(i))
		}
		return ids
	}
	for _, tc := range []struct {
		name string
		out  string
		want []string
		once bool
		bad  string // the counter that must be 1 (empty: no violation)
	}{
		{"in order", out(row{0, 0, 0}, row{0, 1, 1}, row{0, 2, 2}), all(3), false, ""},
		{"a replay repeats earlier rows", out(row{0, 0, 0}, row{0, 1, 1}, row{0, 2, 2}, row{0, 3, 1}, row{0, 4, 2}, row{0, 5, 3}), all(4), false, ""},
		{"a replay's repeats are duplicates in exactly-once mode", out(row{0, 0, 0}, row{0, 1, 1}, row{0, 2, 1}), all(2), true, "duplicates"},
		{"a key moved once, its replay into the new partition", out(row{0, 0, 0}, row{0, 1, 1}, row{0, 2, 2}, row{3, 0, 1}, row{3, 1, 2}, row{3, 2, 3}), all(4), false, ""},
		{"a row missing", out(row{0, 0, 0}, row{0, 1, 2}), all(3), false, "missing"},
		{"reordered within a partition", out(row{0, 0, 0}, row{0, 1, 2}, row{0, 2, 1}), all(3), false, "order"},
		{"back in the old partition", out(row{0, 0, 0}, row{0, 1, 1}, row{3, 0, 2}, row{3, 1, 3}, row{0, 2, 4}), all(5), false, "back"},
		{"in three partitions", out(row{0, 0, 0}, row{3, 0, 1}, row{5, 0, 2}), all(3), false, "three"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.out, tc.want, tc.once)
			got := map[string]int{"missing": v.missing, "order": v.orderViolations, "back": v.backInOld, "three": v.threePartitions}
			if tc.once {
				got["duplicates"] = v.duplicates
			}
			for k, n := range got {
				want := 0
				if k == tc.bad {
					want = 1
				}
				if n != want {
					t.Errorf("%s = %d, want %d (%s; %v)", k, n, want, v, v.first)
				}
			}
			if (tc.bad == "") != (v.violations() == 0) {
				t.Errorf("violations %d (%s)", v.violations(), v)
			}
		})
	}
}
