package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
)

// DebeziumVersion is the Debezium release of the -debezium contender, and
// ConnectVersion the Kafka Connect it runs in (standalone): the Kafka
// release Debezium is built against (it uses client classes that 4.4
// removed). Either talks to the 4.4 broker.
const (
	DebeziumVersion = "3.6.1.Final"
	ConnectVersion  = "4.3.0"
)

// debezium runs Debezium's PostgreSQL connector with its outbox event
// router, in a Kafka Connect standalone worker, on the slot and into the
// real broker: the reference connector on the same WAL range and the same
// finish line (the slot's confirmed_flush_lsn reaching the end). The clock
// starts when the connector has taken the slot, so the JVM's start-up is not
// counted; Debezium confirms its position when it commits offsets, every
// 100 ms here, and moves it past its last event with heartbeats, every
// 100 ms here.
func debezium(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, _ int) (result, error) {
	lib, err := kafkatest.FetchJars(ctx, "", "debezium-"+DebeziumVersion+"-connect-"+ConnectVersion, kafkatest.Pom(
		"io.debezium:debezium-connector-postgres:"+DebeziumVersion,
		"org.apache.kafka:connect-runtime:"+ConnectVersion))
	if err != nil {
		return result{}, err
	}
	addrs, prefix, _, err := realBrokers()
	if err != nil {
		return result{}, err
	}
	dir, err := os.MkdirTemp("", "walrelay-debezium")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	rest := l.Addr().String()
	l.Close()
	files := map[string]string{
		"worker.properties": strings.Join([]string{
			"bootstrap.servers=" + strings.Join(addrs, ","),
			"key.converter=org.apache.kafka.connect.storage.StringConverter",
			"value.converter=org.apache.kafka.connect.storage.StringConverter",
			"offset.storage.file.filename=" + filepath.Join(dir, "offsets"),
			"offset.flush.interval.ms=100",
			"listeners=http://" + rest,
			"plugin.discovery=only_scan",
		}, "\n"),
		// Outbox-shaped as walrelay publishes: key aggregateid, value the
		// payload as stored, a topic per aggregate type, id and type in
		// headers.
		"connector.properties": strings.Join([]string{
			"name=bench-outbox-" + slot,
			"connector.class=io.debezium.connector.postgresql.PostgresConnector",
			"plugin.name=pgoutput",
			"database.hostname=127.0.0.1",
			fmt.Sprintf("database.port=%d", pg.Port()),
			"database.user=postgres",
			"database.dbname=postgres",
			"topic.prefix=dbz" + strings.TrimSuffix(prefix, "."),
			"slot.name=" + slot,
			"publication.name=walrelay_outbox",
			"publication.autocreate.mode=disabled",
			"snapshot.mode=no_data",
			"table.include.list=public.outbox",
			"tombstones.on.delete=false",
			// Without heartbeats Debezium confirms only the position of its
			// last event, never the WAL after it: the slot would not reach
			// the finish line (nor stop holding WAL on an idle outbox).
			"heartbeat.interval.ms=100",
			"transforms=outbox",
			"transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
			"transforms.outbox.route.topic.replacement=" + prefix + "outbox.event.${routedByValue}",
			"transforms.outbox.table.fields.additional.placement=type:header:type",
		}, "\n"),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content+"\n"), 0o644); err != nil {
			return result{}, err
		}
	}
	java, jvm, err := kafkatest.JVM(dir, lib)
	if err != nil {
		return result{}, err
	}
	cmd, err := kafkatest.StartJava(dir, java, append(append([]string{"-Xms128m", "-Xmx1g"}, jvm...),
		"org.apache.kafka.connect.cli.ConnectStandalone", filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties"))...)
	if err != nil {
		return result{}, fmt.Errorf("start Kafka Connect: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		return result{}, err
	}
	defer conn.Close(context.Background())
	failed := func(what string) error {
		b, _ := os.ReadFile(filepath.Join(dir, "java.log"))
		o, _ := os.ReadFile(filepath.Join(dir, "stdout.log"))
		return fmt.Errorf("debezium %s:\n%s\n%s", what, tail(string(o), 3000), tail(string(b), 3000))
	}
	var began time.Time
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var active bool
		var text string
		if err := conn.QueryRow(ctx, "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active, &text); err != nil {
			return result{}, err
		}
		if active && began.IsZero() {
			began = time.Now()
		}
		if lsn, _ := pglogrepl.ParseLSN(text); lsn >= end && !began.IsZero() {
			break
		}
		select {
		case <-done:
			return result{}, failed("exited")
		default:
		}
		if time.Now().After(deadline) {
			return result{}, failed("did not confirm " + end.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(began)
	rss, cpu := procStats(cmd.Process.Pid)
	return result{elapsed: elapsed, rss: rss, cpu: cpu}, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
