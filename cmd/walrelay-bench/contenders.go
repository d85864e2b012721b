package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/noredirect"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

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

// adminClient is the bench's client of walrelay's admin listener: like
// walrelay's own clients, it follows no redirect.
var adminClient = noredirect.Client(nil, time.Minute)

func profile(admin, path string) {
	time.Sleep(300 * time.Millisecond)
	resp, err := adminClient.Get("http://" + admin + "/debug/pprof/profile?seconds=3")
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = os.WriteFile(path, b, 0o644)
}
