package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/replication"
)

// point is one latency run.
type point struct {
	rows              int
	offered, achieved float64
	p50, p99, p999    time.Duration
	samples           int
	base              quantiles // the raw receiver's commit-to-receipt at the same load
	ackP99            float64   // walrelay's own commit-to-ack p99, seconds: the upper bound of its histogram bucket
	relayCores        float64   // walrelay's CPU during the load, in cores
	machineBusy       float64   // the share of the machine's CPU that was busy
}

// machineCPU returns the busy and total CPU ticks of the machine (/proc/stat).
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, x := range f[1:] {
		v, _ := strconv.ParseFloat(x, 64)
		total += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, total
}

// quantiles of a latency sample.
type quantiles struct{ p50, p99, p999 time.Duration }

func quantilesOf(xs []time.Duration) quantiles {
	if len(xs) == 0 {
		return quantiles{}
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
	q := func(p float64) time.Duration { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
	return quantiles{q(0.5), q(0.99), q(0.999)}
}

// latency runs walrelay live and, for each offered rate, writes one-row
// transactions at that rate and measures commit-to-consume latency: the
// consumer's receive time against the commit time in the record's header.
// With exactlyOnce, walrelay runs in exactly-once mode and the consumer
// reads with read_committed isolation.
func latency(ctx context.Context, o options, exactlyOnce bool) (string, []point, error) {
	fmt.Fprintln(os.Stderr, "latency: starting PostgreSQL, kfake and walrelay …")
	pg, conn, closeAll, err := freshServer(ctx)
	if err != nil {
		return "", nil, err
	}
	defer closeAll()
	kc, err := newKfake()
	if err != nil {
		return "", nil, err
	}
	defer kc.Close()
	// Baseline: the same loads read by a raw receiver on a slot of its own,
	// commit to receipt; what the database and one walsender cost before
	// walrelay does anything.
	base, err := baseline(ctx, o, pg.DSN, conn)
	if err != nil {
		return "", nil, fmt.Errorf("baseline: %w", err)
	}
	if _, err := replication.EnsureSlot(ctx, conn, "walrelay", "", false); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(o.bin, "run")
	// The admin listener serves walrelay's own commit-to-ack histogram, read
	// before and after each load, and the profile of -latency-profile.
	admin := "127.0.0.1:18089"
	cmd.Env = append(os.Environ(), "WALRELAY_POSTGRES_DSN="+pg.DSN, "WALRELAY_KAFKA_BROKERS="+strings.Join(kc.Addrs(), ","),
		"WALRELAY_ADMIN_LISTEN="+admin, "WALRELAY_LOG_LEVEL=warn",
		"WALRELAY_KAFKA_HEADERS=type,walrelay.commit_time") // what the measure reads, whatever the environment says
	isolation := kgo.ReadUncommitted()
	if exactlyOnce {
		cmd.Env = append(cmd.Env, "WALRELAY_KAFKA_EXACTLY_ONCE=true", "WALRELAY_KAFKA_TRANSACTION_INTERVAL="+o.txnInterval.String())
		isolation = kgo.ReadCommitted()
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()

	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumeTopics("outbox.event.order"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.MetadataMinAge(100*time.Millisecond), kgo.AllowAutoTopicCreation(), kgo.FetchIsolationLevel(isolation))
	if err != nil {
		return "", nil, err
	}
	defer cl.Close()
	var mu sync.Mutex
	lat := map[string][]time.Duration{} // by run tag
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				ct, err := time.Parse(time.RFC3339Nano, string(kafkatest.Header(r, "walrelay.commit_time")))
				if err != nil {
					return
				}
				mu.Lock()
				lat[string(kafkatest.Header(r, "type"))] = append(lat[string(kafkatest.Header(r, "type"))], now.Sub(ct))
				mu.Unlock()
			})
		}
	}()

	// Warm up: the topic exists and every connection is made.
	if err := writeAt(ctx, pg.DSN, rate{200, 1}, time.Second, "warmup"); err != nil {
		return "", nil, err
	}
	time.Sleep(time.Second)
	var points []point
	for _, rate := range o.rates {
		tag := fmt.Sprintf("rate%dx%d", rate.events, rate.rows)
		began := time.Now()
		if o.latencyProfile != "" && len(points) == 0 {
			go profile(admin, o.latencyProfile)
		}
		h0, _ := ackHistogram(admin)
		_, cpu0 := procStats(cmd.Process.Pid)
		busy0, total0 := machineCPU()
		if err := writeAt(ctx, pg.DSN, rate, o.duration, tag); err != nil {
			return "", nil, err
		}
		wrote := time.Since(began)
		_, cpu1 := procStats(cmd.Process.Pid)
		busy1, total1 := machineCPU()
		time.Sleep(2 * time.Second) // let the tail arrive
		h1, err := ackHistogram(admin)
		if err != nil {
			return "", nil, err
		}
		mu.Lock()
		xs := append([]time.Duration(nil), lat[tag]...)
		mu.Unlock()
		if len(xs) == 0 {
			return "", nil, fmt.Errorf("no events arrived at %d/s", rate.events)
		}
		sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
		q := func(p float64) time.Duration { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
		pt := point{rows: rate.rows, offered: float64(rate.events), achieved: float64(len(xs)) / wrote.Seconds(), p50: q(0.5), p99: q(0.99), p999: q(0.999), samples: len(xs),
			ackP99: h1.minus(h0).quantile(0.99),
			base:   base[tag], relayCores: (cpu1 - cpu0) / wrote.Seconds(), machineBusy: (busy1 - busy0) / max(total1-total0, 1e-9)}
		fmt.Fprintf(os.Stderr, "  %d/s offered in %d-row transactions: %.0f/s achieved, p50 %s p99 %s p99.9 %s\n", rate.events, rate.rows, pt.achieved, pt.p50, pt.p99, pt.p999)
		points = append(points, pt)
	}
	var b strings.Builder
	if exactlyOnce {
		fmt.Fprintf(&b, "### Commit-to-consume latency, exactly-once (Kafka transactions every %s, a read_committed consumer), %s per load\n\n", o.txnInterval, o.duration)
	} else {
		fmt.Fprintf(&b, "### Commit-to-consume latency, %s per load\n\n", o.duration)
	}
	b.WriteString("| offered events/s | rows per transaction | achieved | walrelay p50 | p99 | p99.9 | commit-to-ack p99 (walrelay's histogram) | baseline: raw receiver p50 | p99 | p99.9 | walrelay CPU | machine busy |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, p := range points {
		offered := fmt.Sprintf("%.0f", p.offered)
		if p.offered == 0 {
			offered = "unpaced (16 writers)"
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | ≤ %s | %s | %s | %s | %.2f cores | %.0f%% |\n", offered, p.rows, p.achieved, ms(p.p50), ms(p.p99), ms(p.p999),
			ms(time.Duration(p.ackP99*float64(time.Second))), ms(p.base.p50), ms(p.base.p99), ms(p.base.p999), p.relayCores, 100*p.machineBusy)
	}
	b.WriteString("\nwalrelay: commit time (header) to the consumer's receipt through kfake; commit-to-ack: walrelay's own histogram (commit time to Kafka's acknowledgement, no consumer), the upper bound of the bucket that holds the 99th percentile; baseline: commit time (Begin) to a raw receiver's receipt of each insert, the same loads, run first.\n")
	return b.String(), points, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// writeAt commits outbox transactions of r.rows rows at r.events rows per
// second for d, from as many connections as the rate needs, typed tag.
func writeAt(ctx context.Context, dsn string, r rate, d time.Duration, tag string) error {
	txns := max(1, r.events/r.rows)
	writers := max(1, min(txns/500, 16))
	per := float64(txns) / float64(writers)
	if r.events == 0 { // unpaced: what the database sustains
		writers, per = 16, 1e9
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	deadline := time.Now().Add(d)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			interval := time.Duration(float64(time.Second) / per)
			next := time.Now().Add(time.Duration(w) * interval / time.Duration(writers))
			for n := 0; time.Now().Before(deadline); n++ {
				if wait := time.Until(next); wait > 0 {
					time.Sleep(wait)
				}
				next = next.Add(interval)
				if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
					SELECT gen_random_uuid(), 'order', $1 || '-' || g, $2, jsonb_build_object('pad', repeat('x', 270))
					FROM generate_series(1, $3) AS g`, fmt.Sprintf("agg-%d-%d", w, n%100), tag, r.rows); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// baseline runs every load of o against a raw receiver on a slot of its own
// and returns commit-to-receipt quantiles by load tag.
func baseline(ctx context.Context, o options, dsn string, conn *pgx.Conn) (map[string]quantiles, error) {
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('rawlat', 'pgoutput')"); err != nil {
		return nil, err
	}
	defer conn.Exec(context.Background(), "SELECT pg_drop_replication_slot('rawlat')") //nolint:errcheck // the server is thrown away
	cfg, err := replication.ReplicationConfig(dsn)
	if err != nil {
		return nil, err
	}
	rc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer rc.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, rc, "rawlat", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'walrelay_outbox'"},
	}); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	lat := map[string][]time.Duration{}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var commit time.Time
		var last pglogrepl.LSN
		next := time.Now()
		for rctx.Err() == nil {
			if time.Now().After(next) {
				_ = pglogrepl.SendStandbyStatusUpdate(rctx, rc, pglogrepl.StandbyStatusUpdate{WALWritePosition: last})
				next = time.Now().Add(time.Second)
			}
			mctx, cancel := context.WithTimeout(rctx, 200*time.Millisecond)
			raw, err := rc.ReceiveMessage(mctx)
			cancel()
			if err != nil {
				if pgconn.Timeout(err) {
					continue
				}
				return
			}
			now := time.Now()
			cd, ok := raw.(*pgproto3.CopyData)
			if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
				continue
			}
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				continue
			}
			switch m := m.(type) {
			case *pglogrepl.BeginMessage:
				commit = m.CommitTime
			case *pglogrepl.CommitMessage:
				last = m.TransactionEndLSN
			case *pglogrepl.InsertMessage:
				if len(m.Tuple.Columns) > 3 {
					tag := string(m.Tuple.Columns[3].Data)
					mu.Lock()
					lat[tag] = append(lat[tag], now.Sub(commit))
					mu.Unlock()
				}
			}
		}
	}()
	// The receiver owns rc until it returns: rc.Close (deferred above)
	// writes Terminate through the frontend it writes status updates to.
	defer func() { stop(); <-done }()
	for _, r := range o.rates {
		tag := fmt.Sprintf("rate%dx%d", r.events, r.rows)
		if err := writeAt(ctx, dsn, r, o.duration, tag); err != nil {
			return nil, err
		}
		time.Sleep(time.Second)
		mu.Lock()
		q := quantilesOf(lat[tag])
		mu.Unlock()
		fmt.Fprintf(os.Stderr, "  baseline %d/s in %d-row transactions: p50 %s p99 %s p99.9 %s\n", r.events, r.rows, q.p50, q.p99, q.p999)
	}
	stop()
	<-done
	out := map[string]quantiles{}
	mu.Lock()
	defer mu.Unlock()
	for tag, xs := range lat {
		out[tag] = quantilesOf(xs)
	}
	return out, nil
}

// histogram is a cumulative Prometheus histogram: upper bounds and counts.
type histogram struct {
	le     []float64
	counts []float64
}

// ackHistogram scrapes walrelay_commit_to_ack_seconds from walrelay's admin
// listener.
func ackHistogram(admin string) (histogram, error) {
	resp, err := adminClient.Get("http://" + admin + "/metrics")
	if err != nil {
		return histogram{}, fmt.Errorf("scrape walrelay's metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return histogram{}, err
	}
	var h histogram
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, `walrelay_commit_to_ack_seconds_bucket{le="`)
		if !ok {
			continue
		}
		bound, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		le, err1 := strconv.ParseFloat(bound, 64)
		if bound == "+Inf" {
			le, err1 = math.Inf(1), nil
		}
		n, err2 := strconv.ParseFloat(count, 64)
		if err1 == nil && err2 == nil {
			h.le = append(h.le, le)
			h.counts = append(h.counts, n)
		}
	}
	return h, nil
}

func (h histogram) minus(o histogram) histogram {
	d := histogram{le: h.le, counts: append([]float64(nil), h.counts...)}
	for i := range d.counts {
		if i < len(o.counts) {
			d.counts[i] -= o.counts[i]
		}
	}
	return d
}

// quantile returns the upper bound of the bucket that holds quantile q.
func (h histogram) quantile(q float64) float64 {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	want := q * h.counts[len(h.counts)-1]
	for i, c := range h.counts {
		if c >= want {
			return h.le[i]
		}
	}
	return h.le[len(h.le)-1]
}
