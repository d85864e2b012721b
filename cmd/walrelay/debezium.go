package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

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
	if err != nil {
		return err
	}
	out, err := config.DebeziumYAML(keys)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# walrelay configuration imported from %s by walrelay debezium import\n%s", pos[0], out)
	return nil
}
