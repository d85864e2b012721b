package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
	"github.com/walrelay/walrelay/migrations"
)

// pollBench compares the poll source with the WAL source on the same rows
// (-poll): for each data set and run, the outbox is emptied and loaded
// afresh (with the poll columns and the insert trigger in place, and a slot
// created before the load); walrelay with the WAL source streams the slot
// until it confirmed the load's end, then walrelay with source poll claims,
// publishes and marks every row SENT. Each into a kfake of its own. It
// reports events/s, and the WAL each source writes per event (the poll
// source's claims and marks are updates), beside the WAL of the insert
// itself.
func pollBench(ctx context.Context, o options, rows int) (string, error) {
	fmt.Fprintf(os.Stderr, "poll vs WAL: %d rows per transaction, %d rows a run …\n", rows, o.pollEvents)
	pg, conn, closeAll, err := freshServer(ctx)
	if err != nil {
		return "", err
	}
	defer closeAll()
	if _, err := migrations.ApplyPoll(ctx, conn, decoder.Config{}); err != nil {
		return "", err
	}
	// The outbox as the WAL source wants it (walrelay_emit inserts a row
	// for both sources while outbox.messages is off).
	if _, err := migrations.Apply(ctx, conn, decoder.Config{}); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, loadSQL); err != nil {
		return "", fmt.Errorf("create the load procedure: %w", err)
	}
	lsn := func() (pglogrepl.LSN, error) {
		var s string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
			return 0, err
		}
		return pglogrepl.ParseLSN(s)
	}
	var walRate, pollRate, insertWAL, walWAL, pollWAL []float64
	var pollRSS, pollCPU []float64
	n := float64(o.pollEvents)
	for r := range o.runs {
		slot := fmt.Sprintf("poll_bench_%d", r)
		if _, err := conn.Exec(ctx, "TRUNCATE outbox"); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return "", err
		}
		l0, err := lsn()
		if err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "CALL bench_load($1, $2, $3)", o.pollEvents, rows, max(o.payload-30, 0)); err != nil {
			return "", fmt.Errorf("load: %w", err)
		}
		end, err := lsn()
		if err != nil {
			return "", err
		}
		insertWAL = append(insertWAL, float64(end-l0)/n)
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return "", err
		}
		w0, err := lsn()
		if err != nil {
			return "", err
		}
		x, err := walrelay(o.bin, kfakeBrokers, 1)(ctx, pg, slot, end, o.pollEvents)
		if err != nil {
			return "", fmt.Errorf("the WAL source: %w", err)
		}
		w1, err := lsn()
		if err != nil {
			return "", err
		}
		walRate = append(walRate, n/x.elapsed.Seconds())
		walWAL = append(walWAL, float64(w1-w0)/n)
		if err := dropSlot(ctx, conn, slot); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			return "", err
		}
		p0, err := lsn()
		if err != nil {
			return "", err
		}
		y, err := pollRun(ctx, o.bin, pg, conn)
		if err != nil {
			return "", fmt.Errorf("the poll source: %w", err)
		}
		p1, err := lsn()
		if err != nil {
			return "", err
		}
		pollRate = append(pollRate, n/y.elapsed.Seconds())
		pollWAL = append(pollWAL, float64(p1-p0)/n)
		pollRSS = append(pollRSS, float64(y.rss)/(1<<20))
		pollCPU = append(pollCPU, y.cpu/n*100000)
		fmt.Fprintf(os.Stderr, "  run %d: WAL source %8.0f events/s, %5.0f WAL bytes/event; poll source %8.0f events/s, %5.0f WAL bytes/event (the insert: %.0f)\n",
			r+1, walRate[r], walWAL[r], pollRate[r], pollWAL[r], insertWAL[r])
	}
	wr, pr := summarize(walRate), summarize(pollRate)
	var b strings.Builder
	fmt.Fprintf(&b, "### poll vs WAL source: %d rows per transaction, %d events, %d-byte payloads\n\n", rows, o.pollEvents, o.payload)
	fmt.Fprintf(&b, "| source | events/s: median (min to max) of %d | × the WAL source | WAL written by the relay per event: median (min to max) |\n| --- | --- | --- | --- |\n", o.runs)
	fmt.Fprintf(&b, "| walrelay, `source: wal`, into kfake, until `confirmed_flush_lsn` reaches the load's end | %s | 1.00 | %s B |\n", wr, bytesStats(summarize(walWAL)))
	fmt.Fprintf(&b, "| walrelay, `source: poll`, into kfake, until every row is `SENT` | %s | %.2f | %s B |\n", pr, pr.med/wr.med, bytesStats(summarize(pollWAL)))
	fmt.Fprintf(&b, "| the insert itself (row, primary key, the poll indexes, the NOTIFY trigger), for scale | | | %s B |\n", bytesStats(summarize(insertWAL)))
	r, c := summarize(pollRSS), summarize(pollCPU)
	fmt.Fprintf(&b, "\nwalrelay with source poll: peak RSS %.1f MiB (%.1f to %.1f), CPU %.2f s per 100k events (%.2f to %.2f).\n", r.med, r.lo, r.hi, c.med, c.lo, c.hi)
	return b.String(), nil
}

func bytesStats(s stats) string { return fmt.Sprintf("%.0f (%.0f to %.0f)", s.med, s.lo, s.hi) }

// pollRun runs walrelay with source poll into a fresh kfake until no row
// of the outbox is left unsent.
func pollRun(ctx context.Context, bin string, pg *pgtest.Server, conn *pgx.Conn) (result, error) {
	addrs, prefix, closeKafka, err := kfakeBrokers()
	if err != nil {
		return result{}, err
	}
	defer closeKafka()
	var out bytes.Buffer
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(), "WALRELAY_SOURCE=poll", "WALRELAY_POSTGRES_DSN="+pg.DSN, "WALRELAY_KAFKA_BROKERS="+strings.Join(addrs, ","),
		"WALRELAY_KAFKA_TOPIC="+prefix+"outbox.event.{aggregatetype}", "WALRELAY_KAFKA_DLQ_TOPIC="+prefix+"walrelay.dlq",
		"WALRELAY_ADMIN_LISTEN=", "WALRELAY_LOG_LEVEL=warn")
	cmd.Stdout, cmd.Stderr = &out, &out
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); <-done }()
	for {
		var left bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox WHERE status <> 'SENT')").Scan(&left); err != nil {
			return result{}, err
		}
		if !left {
			break
		}
		select {
		case <-done:
			return result{}, fmt.Errorf("walrelay exited with rows unsent:\n%s", out.String())
		default:
		}
		if time.Since(began) > 10*time.Minute {
			return result{}, fmt.Errorf("rows unsent after 10 minutes:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	x := result{elapsed: time.Since(began)}
	x.rss, x.cpu = procStats(cmd.Process.Pid)
	return x, nil
}
