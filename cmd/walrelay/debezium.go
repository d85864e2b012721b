package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/walrelay/walrelay/config"
)

// cmdDebezium is `walrelay debezium import FILE [--worker FILE]`: a
// Debezium PostgreSQL connector configuration with the outbox EventRouter
// as walrelay's YAML on stdout; what it ignores, and why, on stderr; exit 1
// naming every option walrelay does not reproduce.
func cmdDebezium(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "import" {
		return usageError{"debezium: want import FILE [--worker FILE]"}
	}
	fs := flag.NewFlagSet("debezium import", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workerFile := fs.String("worker", "", "the Kafka Connect worker's properties (bootstrap servers, default converters)")
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError{"debezium import: want one connector configuration FILE (.properties or Kafka Connect JSON)"}
	}
	read := func(path string) (map[string]string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		m, err := config.ReadDebezium(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return m, nil
	}
	connector, err := read(pos[0])
	if err != nil {
		return err
	}
	var worker map[string]string
	if *workerFile != "" {
		if worker, err = read(*workerFile); err != nil {
			return err
		}
	}
	keys, ignored, err := config.FromDebezium(connector, worker)
	for _, n := range ignored {
		fmt.Fprintf(stderr, "ignored: %s: %s\n", n.Option, n.Why)
	}
	var refused *config.DebeziumRefused
	if errors.As(err, &refused) {
		// One refusal a line, each readable alone; no YAML: a
		// configuration that behaves otherwise than Debezium's is not
		// written.
		for _, n := range refused.Refused {
			fmt.Fprintf(stderr, "refused: %s: %s\n", n.Option, n.Why)
		}
		return fmt.Errorf("walrelay does not reproduce the %d option(s) refused above, so no YAML was written: change or remove each in the connector's configuration and import again", len(refused.Refused))
	}
	if err != nil {
		return err
	}
	out, err := config.DebeziumYAML(keys)
	if err != nil {
		return err
	}
	header := "# walrelay configuration imported from " + pos[0] + " by walrelay debezium import\n"
	if keys["kafka.brokers"] == "" {
		const missing = "bootstrap.servers is in the Kafka Connect worker's configuration, not the connector's: import again with --worker FILE, or set kafka.brokers (walrelay run and check refuse to start without it)"
		fmt.Fprintf(stderr, "missing: kafka.brokers: %s\n", missing)
		header += "# MISSING kafka.brokers: " + missing + "\n"
	}
	dropOnStop := strings.EqualFold(strings.TrimSpace(connector["slot.drop.on.stop"]), "true")
	if dropOnStop {
		// Stopping Debezium would drop the slot walrelay takes over, and
		// with it the rows committed since Debezium's position.
		warn := "the connector has slot.drop.on.stop=true: stopping Debezium DROPS slot " + keys["postgres.slot"] +
			", the slot walrelay is to take over, and the rows committed since Debezium's last position are then in no stream. " +
			"FIRST set slot.drop.on.stop=false in the connector's configuration (PUT /connectors/NAME/config) and let it restart, then follow the steps"
		fmt.Fprintf(stderr, "WARNING: %s\n", warn)
		header += "# WARNING: " + warn + "\n"
	}
	if keys["postgres.publication"] == "walrelay_outbox" {
		// The switch-over's order, with the file it needs.
		header += "# Switching from Debezium on slot " + keys["postgres.slot"] + " (docs/debezium.md):\n"
		if dropOnStop {
			header += "#   0. set slot.drop.on.stop=false on the connector first (see the WARNING above)\n"
		}
		header += "#   1. while Debezium still runs: walrelay publication create --config walrelay.yaml\n" +
			"#   2. walrelay check --config walrelay.yaml, until it says OK for slot " + keys["postgres.slot"] + "\n" +
			"#   3. stop Debezium (delete the connector), then: walrelay run --config walrelay.yaml\n"
	}
	fmt.Fprintf(stdout, "%s%s", header, out)
	return nil
}
