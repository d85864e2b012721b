package kafkatest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/freeport"
)

// DebeziumVersion is the Debezium release the tests and the benchmark run,
// and ConnectVersion the Kafka Connect it runs in (standalone): the Kafka
// release Debezium is built against (it uses client classes that 4.4
// removed). Either talks to the 4.4 broker.
const (
	DebeziumVersion = "3.6.1.Final"
	ConnectVersion  = "4.3.0"
)

// Connect is a Kafka Connect standalone worker running one connector.
type Connect struct {
	dir  string
	pid  int
	stop func()
	done chan struct{}
}

// StartDebezium starts Debezium's PostgreSQL connector in a Kafka Connect
// standalone worker (its jars fetched with Maven into the cache the first
// time), with worker and connector as the two properties files; the worker
// gets a REST listener of its own and a file offset store in its
// directory unless worker sets them.
func StartDebezium(ctx context.Context, worker, connector map[string]string) (*Connect, error) {
	return StartDebeziumWith(ctx, nil, worker, connector)
}

// StartDebeziumWith is StartDebezium with more jars on the worker's class
// path: the runtime dependencies of extra ("group:artifact:version" each;
// a converter's), in a cache directory of their own.
func StartDebeziumWith(ctx context.Context, extra []string, worker, connector map[string]string) (*Connect, error) {
	name := "debezium-" + DebeziumVersion + "-connect-" + ConnectVersion
	for _, d := range extra {
		p := strings.Split(d, ":")
		name += "-" + p[1] + "-" + p[len(p)-1]
	}
	lib, err := FetchJars(ctx, "", name, Pom(append([]string{
		"io.debezium:debezium-connector-postgres:" + DebeziumVersion,
		"org.apache.kafka:connect-runtime:" + ConnectVersion}, extra...)...))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "walrelay-debezium")
	if err != nil {
		return nil, err
	}
	w := map[string]string{"offset.storage.file.filename": filepath.Join(dir, "offsets"), "offset.flush.interval.ms": "100", "plugin.discovery": "only_scan"}
	if _, ok := worker["listeners"]; !ok {
		port, err := freeport.One()
		if err != nil {
			return nil, err
		}
		w["listeners"] = fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	for k, v := range worker {
		w[k] = v
	}
	for name, props := range map[string]map[string]string{"worker.properties": w, "connector.properties": connector} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(Properties(props)), 0o644); err != nil {
			return nil, err
		}
	}
	java, jvm, err := JVM(dir, lib)
	if err != nil {
		return nil, err
	}
	cmd, err := StartJava(dir, java, append(append([]string{"-Xms128m", "-Xmx1g"}, jvm...),
		"org.apache.kafka.connect.cli.ConnectStandalone", filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties"))...)
	if err != nil {
		return nil, fmt.Errorf("start Kafka Connect: %w", err)
	}
	c := &Connect{dir: dir, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	c.stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-c.done
		}
	}
	return c, nil
}

// Properties renders a properties file.
func Properties(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + m[k] + "\n")
	}
	return b.String()
}

// Pid is the worker's process id.
func (c *Connect) Pid() int { return c.pid }

// Done is closed when the worker exited.
func (c *Connect) Done() <-chan struct{} { return c.done }

// Logs returns the ends of the worker's output and log.
func (c *Connect) Logs() string {
	o, _ := os.ReadFile(filepath.Join(c.dir, "stdout.log"))
	l, _ := os.ReadFile(filepath.Join(c.dir, "java.log"))
	tail := func(b []byte) string {
		if len(b) > 4000 {
			return "…" + string(b[len(b)-4000:])
		}
		return string(b)
	}
	return tail(o) + "\n" + tail(l)
}

// Stop stops the worker (SIGTERM: it commits its offsets) and removes its
// directory.
func (c *Connect) Stop() {
	c.stop()
	os.RemoveAll(c.dir)
}

// DebeziumOutbox is the configuration of Debezium's outbox connector as
// walrelay's tests and benchmark run it: the PostgreSQL at 127.0.0.1:pgPort
// (database and user postgres), slot, the publication walrelay_outbox
// (walrelay migrate makes it), no snapshot, heartbeats every 100 ms, the
// EventRouter routing to topic (route.topic.replacement), StringConverters
// on the worker. Callers add or change keys.
func DebeziumOutbox(brokers []string, pgPort int, slot, topicPrefix, topic string) (worker, connector map[string]string) {
	worker = map[string]string{
		"bootstrap.servers": strings.Join(brokers, ","),
		"key.converter":     "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":   "org.apache.kafka.connect.storage.StringConverter",
	}
	connector = map[string]string{
		"name":                        "outbox-" + slot,
		"connector.class":             "io.debezium.connector.postgresql.PostgresConnector",
		"plugin.name":                 "pgoutput",
		"database.hostname":           "127.0.0.1",
		"database.port":               fmt.Sprint(pgPort),
		"database.user":               "postgres",
		"database.dbname":             "postgres",
		"topic.prefix":                topicPrefix,
		"slot.name":                   slot,
		"publication.name":            "walrelay_outbox",
		"publication.autocreate.mode": "disabled",
		"snapshot.mode":               "no_data",
		"table.include.list":          "public.outbox",
		// Without heartbeats Debezium confirms only the position of its
		// last event, never the WAL after it: its slot would hold WAL on
		// an idle outbox.
		"heartbeat.interval.ms":                     "100",
		"transforms":                                "outbox",
		"transforms.outbox.type":                    "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.route.topic.replacement": topic,
	}
	return worker, connector
}
