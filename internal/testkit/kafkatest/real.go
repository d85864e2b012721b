package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/internal/testkit/freeport"
	"github.com/walrelay/walrelay/internal/testkit/proxy"
)

// KafkaVersion is the Apache Kafka release that StartReal runs.
const KafkaVersion = "4.4.0"

// EnvKafka selects the broker of the end-to-end tests: "real" runs Apache
// Kafka (StartReal), anything else kfake.
const EnvKafka = "WALRELAY_TEST_KAFKA"

// Real is a single-node Apache Kafka broker in KRaft mode, run with the
// machine's Java from jars fetched from Maven Central.
type Real struct {
	addr       string
	controller string // the controller listener: no client's port
	cmd        *exec.Cmd
	dir        string
	done       chan struct{}
	// faulty holds the proxies of the listeners that fault tests take, one
	// test at a time each (Faulty).
	faulty chan *proxy.Proxy
	all    []*proxy.Proxy
}

// FaultyListeners is how many listeners of a Real broker sit behind a proxy
// of their own, so that that many tests at once can cut, partition or slow
// their own connections to the shared broker.
const FaultyListeners = 6

// Pom is a Maven project whose runtime dependencies FetchJars copies: the
// given dependencies, "group:artifact:version" each, and a logging binding.
func Pom(deps ...string) string {
	var b strings.Builder
	b.WriteString(`<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>walrelay</groupId><artifactId>fetch</artifactId><version>1</version>
  <dependencies>
`)
	for _, d := range append(deps, "org.slf4j:slf4j-reload4j:1.7.36") {
		p := strings.SplitN(d, ":", 3)
		fmt.Fprintf(&b, "    <dependency><groupId>%s</groupId><artifactId>%s</artifactId><version>%s</version></dependency>\n", p[0], p[1], p[2])
	}
	b.WriteString("  </dependencies>\n</project>\n")
	return b.String()
}

// FetchKafka makes sure the broker's jars are in the cache directory
// (WALRELAY_KAFKA_CACHE, default ~/.cache/walrelay/kafka-<version>) and
// returns the directory that holds them. The first call runs Maven.
func FetchKafka(ctx context.Context) (string, error) {
	return FetchJars(ctx, os.Getenv("WALRELAY_KAFKA_CACHE"), "kafka-"+KafkaVersion, Pom("org.apache.kafka:kafka_2.13:"+KafkaVersion))
}

// FetchKafkaTools is FetchKafka for Apache Kafka's command-line tools
// (kafka-tools: the console consumer and producer), in a cache directory
// of their own.
func FetchKafkaTools(ctx context.Context) (string, error) {
	return FetchJars(ctx, os.Getenv("WALRELAY_KAFKA_TOOLS_CACHE"), "kafka-tools-"+KafkaVersion, Pom("org.apache.kafka:kafka-tools:"+KafkaVersion))
}

// FetchJars makes sure that the runtime dependencies of pom are in
// dir/lib (dir default ~/.cache/walrelay/<name>), running Maven the first
// time, and returns that lib directory.
func FetchJars(ctx context.Context, dir, name, pom string) (string, error) {
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find a cache directory for %s: %w", name, err)
		}
		dir = filepath.Join(home, ".cache", "walrelay", name)
	}
	lib := filepath.Join(dir, "lib")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil // renamed into place only once complete
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("make the cache for %s: %w", name, err)
	}
	// A fetch of its own directory and pom: tests and packages fetch at
	// once on a fresh machine; the first complete one is renamed into place.
	tmp, err := os.MkdirTemp(dir, "lib.tmp-")
	if err != nil {
		return "", fmt.Errorf("make the cache for %s: %w", name, err)
	}
	defer os.RemoveAll(tmp)
	pomFile := tmp + ".pom.xml"
	if err := os.WriteFile(pomFile, []byte(pom), 0o644); err != nil {
		return "", err
	}
	defer os.Remove(pomFile)
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "-f", filepath.Base(pomFile), "dependency:copy-dependencies", "-DoutputDirectory="+filepath.Base(tmp), "-DincludeScope=runtime")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fetch %s with Maven (needs mvn and Maven Central): %v\n%s", name, err, out)
	}
	if err := os.Rename(tmp, lib); err != nil {
		if _, serr := os.Stat(lib); serr == nil {
			return lib, nil // another fetch finished first
		}
		return "", fmt.Errorf("put the jars of %s in place: %w", name, err)
	}
	return lib, nil
}

// StartReal starts a broker that is stopped when the test ends.
func StartReal(t TB) *Real {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := NewReal(ctx)
	if err != nil {
		t.Fatalf("start Apache Kafka: %v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// NewReal fetches (once) and starts a broker on free loopback ports, with a
// small heap, and waits until it answers.
func NewReal(ctx context.Context) (*Real, error) {
	lib, err := FetchKafka(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "walrelay-kafka")
	if err != nil {
		return nil, err
	}
	java, jvm, err := JVM(dir, lib)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ports, err := freeport.Get(2 + FaultyListeners)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	r := &Real{addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), controller: fmt.Sprintf("127.0.0.1:%d", ports[1]), dir: dir, done: make(chan struct{}), faulty: make(chan *proxy.Proxy, FaultyListeners)}
	// Each faulty listener advertises its proxy's address, so a client that
	// bootstraps through the proxy keeps talking through it.
	listeners := []string{"PLAINTEXT://" + r.addr, fmt.Sprintf("CONTROLLER://127.0.0.1:%d", ports[1])}
	advertised := []string{"PLAINTEXT://" + r.addr}
	protocols := []string{"PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"}
	for i, port := range ports[2:] {
		target := fmt.Sprintf("127.0.0.1:%d", port)
		px, err := proxy.New(target)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.all = append(r.all, px)
		r.faulty <- px
		name := fmt.Sprintf("FAULTY%d", i+1)
		listeners = append(listeners, name+"://"+target)
		advertised = append(advertised, name+"://"+px.Addr())
		protocols = append(protocols, name+":PLAINTEXT")
	}
	props := strings.Join([]string{
		"process.roles=broker,controller",
		"node.id=1",
		fmt.Sprintf("controller.quorum.voters=1@127.0.0.1:%d", ports[1]),
		"listeners=" + strings.Join(listeners, ","),
		"advertised.listeners=" + strings.Join(advertised, ","),
		"inter.broker.listener.name=PLAINTEXT",
		"controller.listener.names=CONTROLLER",
		"listener.security.protocol.map=" + strings.Join(protocols, ","),
		"log.dirs=" + filepath.Join(dir, "data"),
		fmt.Sprintf("num.partitions=%d", Partitions),
		"offsets.topic.replication.factor=1",
		"transaction.state.log.replication.factor=1",
		"transaction.state.log.min.isr=1",
		"auto.create.topics.enable=true",
		"group.initial.rebalance.delay.ms=0",
	}, "\n") + "\n"
	conf := filepath.Join(dir, "server.properties")
	if err := os.WriteFile(conf, []byte(props), 0o644); err != nil {
		r.Close()
		return nil, err
	}
	jvm = append([]string{"-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"}, jvm...)
	var id [16]byte
	_, _ = rand.Read(id[:])
	// With "=": an id may start with "-", which would read as a flag.
	clusterID := base64.RawURLEncoding.EncodeToString(id[:])
	format := exec.CommandContext(ctx, java, append(jvm, "kafka.tools.StorageTool", "format", "--cluster-id="+clusterID, "-c", conf)...)
	if out, err := format.CombinedOutput(); err != nil {
		r.Close()
		return nil, fmt.Errorf("format KRaft storage: %v\n%s", err, out)
	}
	if r.cmd, err = StartJava(dir, java, append(jvm, "kafka.Kafka", conf)...); err != nil {
		r.Close()
		return nil, fmt.Errorf("start the broker: %w", err)
	}
	go func() {
		_ = r.cmd.Wait()
		close(r.done)
	}()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.addr))
	if err != nil {
		r.Close()
		return nil, err
	}
	defer cl.Close()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := cl.Ping(pctx)
		cancel()
		if err == nil {
			return r, nil
		}
		select {
		case <-r.done:
			b, _ := os.ReadFile(filepath.Join(dir, "stdout.log"))
			r.Close()
			return nil, fmt.Errorf("the broker exited: %s", b)
		case <-ctx.Done():
			r.Close()
			return nil, fmt.Errorf("the broker did not answer: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Addrs returns the broker's address.
func (r *Real) Addrs() []string { return []string{r.addr} }

// ControllerAddr returns the address of the node's controller listener, a
// port that speaks Kafka's protocol but serves no client.
func (r *Real) ControllerAddr() string { return r.controller }

// Faulty gives a test, until it ends, a listener of its own behind a proxy:
// the address to bootstrap from and the switches of that proxy. Other
// clients of the broker (a test's collector) are not affected by them. It
// waits while every faulty listener is taken.
func (r *Real) Faulty(t TB) ([]string, Network) {
	t.Helper()
	px := <-r.faulty
	t.Cleanup(func() {
		px.Up()
		px.Cut()
		r.faulty <- px
	})
	return []string{px.Addr()}, px
}

// Close stops the broker and removes its files.
func (r *Real) Close() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	for _, px := range r.all {
		px.Close()
	}
	os.RemoveAll(r.dir)
}
