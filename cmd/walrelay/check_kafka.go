package main

import (
	"context"
	"strings"
	"time"

	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/sink/record"
)

// checkKafka checks the brokers, and what exactly-once mode needs of them
// when it is on (txnID is its transactional id, if known), the schema
// registry of the registry formats (avro, registry_passthrough and the
// schema-first ones) and the schema-first subjects.
func checkKafka(ctx context.Context, cfg *config.Config, txnID string) []checkResult {
	out := checkKafkaBrokers(ctx, cfg, txnID)
	_, schemaFirst := record.Format(cfg.Kafka.ValueFormat).SchemaFirst()
	if cfg.Kafka.KeyFormat == string(record.FormatAvro) || cfg.Kafka.ValueFormat == string(record.FormatAvro) || cfg.Kafka.ValueFormat == string(record.FormatRegistryPassthrough) || schemaFirst {
		out = append(out, checkRegistry(ctx, cfg))
	}
	return append(out, checkSchemaFirst(ctx, cfg)...)
}

// checkRegistry checks that the schema registry of the registry formats
// answers, with the configured credentials.
func checkRegistry(ctx context.Context, cfg *config.Config) checkResult {
	r := checkResult{Check: "schema registry"}
	sr := cfg.Kafka.SchemaRegistry
	reg, err := config.Registry(cfg)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err = reg.Ping(pctx)
	}
	if err != nil {
		r.Status, r.Detail = "fail", config.ScrubError(err, cfg.Secrets()).Error()
		return r
	}
	r.Status, r.Detail = "ok", sr.URL+" answers"
	return r
}

func checkKafkaBrokers(ctx context.Context, cfg *config.Config, txnID string) []checkResult {
	r := checkResult{Check: "kafka brokers"}
	if len(cfg.Kafka.Brokers) == 0 {
		r.Status, r.Detail = "fail", "kafka.brokers is not set"
		return []checkResult{r}
	}
	scfg, err := config.SinkConfig(cfg, nil) // no logger: check reports, the client's warnings would clutter it
	// A plain producer: a transactional one would fence the running relay.
	scfg.Transactions = nil
	var sk *sink.Sink
	if err == nil {
		sk, err = sink.New(scfg)
	}
	if err != nil {
		r.Status, r.Detail = "fail", err.Error()
		return []checkResult{r}
	}
	defer sk.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sk.Ping(pctx); err != nil {
		r.Status, r.Detail = "fail", err.Error()
		return []checkResult{r}
	}
	r.Status, r.Detail = "ok", strings.Join(cfg.Kafka.Brokers, ",")+" answer"
	if !cfg.Kafka.ExactlyOnce {
		return []checkResult{r}
	}
	x := checkResult{Check: "kafka exactly-once"}
	// Longer than the ping: a broker's first transactional request makes
	// it create its transaction state topic, which takes seconds.
	tctx, tcancel := context.WithTimeout(ctx, time.Minute)
	defer tcancel()
	if detail, err := sk.CheckTransactions(tctx, cfg.Kafka.OffsetsTopic, txnID); err != nil {
		x.Status, x.Detail = "fail", err.Error()
	} else {
		x.Status, x.Detail = "ok", detail
	}
	return []checkResult{r, x}
}
