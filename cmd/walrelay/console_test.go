package main

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
)

// consoleConsumerIDs reads topic from its start with Apache Kafka's own
// console consumer (kafka-tools, fetched from Maven Central), run with the
// flags of the README's command line and --isolation-level read_committed,
// until it has seen nothing for 10 s, and returns the id header of each
// record it printed, duplicates included. It judges walrelay's records
// with a client no one here wrote.
func consoleConsumerIDs(t *testing.T, kc *broker, topic string) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// The README's line, continued over "\" line ends, after the script.
	m := regexp.MustCompile(`kafka-console-consumer\.sh ((?:[^\n]*\\\n)*[^\n]*)`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("the README shows no kafka-console-consumer.sh command line")
	}
	args := strings.Fields(strings.ReplaceAll(string(m[1]), "\\\n", " "))
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--bootstrap-server":
			args[i+1] = kc.Addrs()[0]
		case "--topic":
			args[i+1] = topic
		}
	}
	out := consoleConsumer(t, args)
	if strings.Contains(string(out), "DEPRECATED") || strings.Contains(strings.ToLower(string(out)), "deprecated") {
		t.Errorf("the README's console consumer line uses a deprecated flag:\n%s", out)
	}
	var ids []string
	for _, id := range regexp.MustCompile(`(?m)(?:^|,)id:([0-9a-f-]{36})`).FindAllStringSubmatch(string(out), -1) {
		ids = append(ids, id[1])
	}
	return ids
}

// consoleConsumer runs Apache Kafka's console consumer (kafka-tools,
// fetched from Maven Central) with args and --isolation-level
// read_committed, until it has seen nothing for 10 s, and returns what it
// printed.
func consoleConsumer(t *testing.T, args []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	lib, err := kafkatest.FetchKafkaTools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	java, jvm, err := kafkatest.JVM(t.TempDir(), lib)
	if err != nil {
		t.Fatal(err)
	}
	args = append(append(append(jvm, "org.apache.kafka.tools.consumer.ConsoleConsumer"), args...), "--isolation-level", "read_committed", "--timeout-ms", "10000")
	out, err := exec.CommandContext(ctx, java, args...).CombinedOutput()
	if !strings.Contains(string(out), "Processed a total of") {
		t.Fatalf("the console consumer (%v): %s", err, out)
	}
	return string(out)
}
