package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
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
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// EnvSoak sets how long TestChaos runs (a Go duration); `make soak` sets it
// to 10m. Default 40s.
const EnvSoak = "WALRELAY_SOAK"

// TestChaos writes outbox rows without pause while a chaos loop injects,
// one after another in rounds of random order, faults 1 to 4 of the fault
// suite: SIGKILL of
// walrelay at a random moment or right after an ack (the faultinject build),
// the broker down, partitioned or slow, retriable produce errors (kfake
// only), PostgreSQL restarted or crashed (immediate stop, then start), the
// replication connection cut, walrelay paused past wal_sender_timeout. A supervisor restarts walrelay whenever it
// dies, as systemd or Kubernetes would. Afterwards every committed id must
// be on the topic, in order per aggregate.
func TestChaos(t *testing.T) {
	long(t)
	chaos(t, false)
}

// TestChaosExactlyOnce is TestChaos in exactly-once mode, read with
// read_committed isolation: duplicates too must be 0.
func TestChaosExactlyOnce(t *testing.T) {
	long(t)
	chaos(t, true)
}

func chaos(t *testing.T, exactlyOnce bool) {
	dur := 40 * time.Second
	if v := os.Getenv(EnvSoak); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvSoak, v, err)
		}
		dur = d
	}
	bin, err := faultBin()
	if err != nil {
		t.Fatal(err)
	}
	t.Parallel()
	pg, kc, col := setup(t)
	needThrowaway(t, pg, "restarts the server")
	if exactlyOnce {
		col = committedCollector(t, kc) // on the brokers' own addresses, as setup's
	}
	network := kc.net(t)
	conn := connect(t, pg.DSN)
	ctx := t.Context()
	for _, sql := range []string{"ALTER SYSTEM SET wal_sender_timeout = '3s'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	px, err := proxy.New(fmt.Sprintf("127.0.0.1:%d", pg.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	e := baseEnv(pg, kc)
	mode := "at-least-once"
	if exactlyOnce {
		e, mode = eosEnv(pg, kc), "exactly-once"
	}
	e = e.with("WALRELAY_POSTGRES_DSN", fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", px.Addr()))

	sup := &supervisor{t: t, bin: bin, env: e}
	sup.start()
	sup.current().waitLog("msg=streaming", time.Minute)

	w := newWriter(40, 16)
	stopWriting := w.keepWriting(ctx, pg.DSN)

	rng := rand.New(rand.NewPCG(17, uint64(time.Now().UnixNano())))
	faults := chaosFaults(t, sup, network, kc.Cluster, pg, px)
	injected := map[string]int{}
	// Each round injects every fault once, in a random order, so that even
	// the short run sees them all.
	var round []int
	for deadline := time.Now().Add(dur); time.Now().Before(deadline); {
		if len(round) == 0 {
			round = rng.Perm(len(faults))
		}
		f := faults[round[0]]
		round = round[1:]
		if f.run == nil {
			continue
		}
		f.run(ctx, rng)
		injected[f.name]++
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
	}
	writeErrs := stopWriting()
	network.Up()

	want := committedIDs(t, connect(t, pg.DSN)) // the first connection did not survive a restart
	if got := len(w.written()); got != len(want) {
		t.Fatalf("the writer counts %d committed rows, the table holds %d", got, len(want))
	}
	c := waitAll(t, col, want, 3*time.Minute)
	names := make([]string, 0, len(injected))
	for n, k := range injected {
		names = append(names, n+"="+strconv.Itoa(k))
	}
	sort.Strings(names)
	if exactlyOnce {
		time.Sleep(time.Second) // room for a late duplicate to show
		c = count(col.Records(), want)
	}
	t.Logf("chaos %s for %s (%s; walrelay started %d times; %d writes failed and were not committed): rows committed %d, %s",
		mode, dur, strings.Join(names, " "), sup.starts.Load(), writeErrs, len(want), c)
	if c.orderViolations != 0 {
		t.Fatalf("order violations: %s", c)
	}
	if exactlyOnce && c.duplicates != 0 {
		t.Fatalf("duplicates in exactly-once mode: %s", c)
	}
	sup.stop()
}

// supervisor keeps one walrelay running, starting it again whenever it
// exits, until stop.
type supervisor struct {
	t       *testing.T
	bin     string
	env     env
	starts  atomic.Int64
	mu      sync.Mutex
	p       *proc
	next    env                   // the environment of the next start only, if set
	envFor  func(start int64) env // if set, the environment of each start (from 1), unless next is set
	args    []string              // default: run
	stopped bool
	wg      sync.WaitGroup
}

func (s *supervisor) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.starts.Add(1)
	e := s.env
	if s.envFor != nil {
		e = s.envFor(n)
	}
	if s.next != nil {
		e, s.next = s.next, nil
	}
	args := s.args
	if args == nil {
		args = []string{"run"}
	}
	p := startBin(s.t, s.bin, e, args...)
	s.p = p
	s.wg.Go(func() {
		<-p.done
		s.mu.Lock()
		stopped := s.stopped
		s.mu.Unlock()
		// A test that failed ends without stop: its context ends first.
		if !stopped && s.t.Context().Err() == nil {
			time.Sleep(100 * time.Millisecond)
			s.start()
		}
	})
}

func (s *supervisor) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// killAfterAck makes the next start a run that kills itself right after
// Kafka acknowledged its nth event, and kills the current one.
func (s *supervisor) killAfterAck(n int) {
	s.mu.Lock()
	s.next = s.env.with("WALRELAY_FAULT_KILL_AFTER_ACKS", strconv.Itoa(n))
	s.mu.Unlock()
	s.current().kill()
}

func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopped = true
	p := s.p
	s.mu.Unlock()
	p.signal(syscall.SIGTERM)
	<-p.done
	s.wg.Wait()
}

type chaosFault struct {
	name string
	run  func(ctx context.Context, rng *rand.Rand) // nil: not available here
}

// chaosFaults lists faults 1 to 4 of the fault suite; fake is nil against
// the real broker, which cannot be made to answer with errors.
func chaosFaults(t *testing.T, sup *supervisor, network kafkatest.Network, fake *kafkatest.Cluster, pg *pgtest.Server, px *proxy.Proxy) []chaosFault {
	outage := func(down func()) func(context.Context, *rand.Rand) {
		return func(_ context.Context, rng *rand.Rand) {
			down()
			time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
			network.Up()
		}
	}
	var retriable func(context.Context, *rand.Rand) // nil against the real broker
	if fake != nil {
		retriable = func(_ context.Context, rng *rand.Rand) {
			left := int64(2 + rng.IntN(4))
			codes := []int16{kerr.NotLeaderForPartition.Code, kerr.RequestTimedOut.Code}
			fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				if left--; left < 0 {
					return nil, nil, false
				}
				fake.KeepControl()
				return kafkatest.RefuseProduce(req.(*kmsg.ProduceRequest), codes[left%2]), nil, true
			})
		}
	}
	faults := []chaosFault{
		{"sigkill", func(context.Context, *rand.Rand) { sup.current().kill() }},
		{"kill_after_ack", func(_ context.Context, rng *rand.Rand) { sup.killAfterAck(1 + rng.IntN(3000)) }},
		{"broker_down", outage(network.Down)},
		{"broker_partition", outage(network.Partition)},
		{"broker_slow", outage(func() { network.Slow(100 * time.Millisecond) })},
		{"retriable_errors", retriable},
		{"postgres_restart", func(ctx context.Context, _ *rand.Rand) {
			if err := pg.Restart(ctx); err != nil {
				t.Errorf("restart postgres: %v", err)
			}
		}},
		{"postgres_crash", func(ctx context.Context, rng *rand.Rand) {
			// Immediate stop: no shutdown checkpoint, crash recovery at start.
			if err := pg.Kill(ctx); err != nil {
				t.Errorf("kill postgres: %v", err)
				return
			}
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
			if err := pg.StartServer(ctx); err != nil {
				t.Errorf("start postgres after the crash: %v", err)
			}
		}},
		{"connection_cut", func(context.Context, *rand.Rand) { px.Cut() }},
		{"sigstop_past_sender_timeout", func(context.Context, *rand.Rand) {
			p := sup.current()
			p.signal(syscall.SIGSTOP)
			time.Sleep(5 * time.Second)
			p.signal(syscall.SIGCONT)
		}},
	}
	return faults
}

// keepWriting writes transactions of 1 to 10 rows, about one every 2 ms,
// through faults (a failed connection is opened again), until the returned
// function is called; that returns how many writes failed and were not
// committed.
func (w *writer) keepWriting(ctx context.Context, dsn string) (stop func() int64) {
	w.dsn = dsn
	writing, cancel := context.WithCancel(ctx)
	var failed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		var wc *pgx.Conn
		for writing.Err() == nil {
			if wc == nil || wc.IsClosed() {
				var err error
				if wc, err = pgx.Connect(writing, dsn); err != nil {
					wc = nil
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			// Not on writing: a commit cut short by the end of the run
			// would leave its outcome unknown to the writer.
			tctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := w.txn(tctx, wc, 1+w.rng.IntN(10)); err != nil {
				failed.Add(1)
				wc.Close(context.Background())
				wc = nil
			}
			cancel()
			time.Sleep(2 * time.Millisecond)
		}
		if wc != nil {
			wc.Close(context.Background())
		}
	})
	return func() int64 {
		cancel()
		wg.Wait()
		return failed.Load()
	}
}
