package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/sink"
	"github.com/walrelay/walrelay/tracing"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := config.NewSet(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := cs.Load(fs, true)
	if err != nil {
		return err
	}
	log := config.NewLogger(cfg, stderr)
	log.Info("starting walrelay", append([]any{"version", version, "commit", commit, "go", runtime.Version()}, cs.Summary()...)...)
	log.Debug("configuration (walrelay config prints it with where each value came from)", cs.Effective()...)
	limitMemory(cfg)
	return config.ScrubError(run(ctx, cfg, log), cfg.Secrets())
}

// cmdConfig prints the effective configuration, as run would load it, as
// YAML: secrets redacted, each value with where it came from.
func cmdConfig(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := config.NewSet(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if _, err := cs.Load(fs, false); err != nil {
		return err
	}
	out, err := cs.YAML()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "# walrelay %s: the effective configuration (secrets redacted), each value with where it came from\n%s", version, out)
	return err
}

// limitMemory sets a soft memory limit unless GOMEMLIMIT does: the
// collector works harder near it instead of letting the heap double; what
// is in flight is bounded by the producer's buffers (max_buffered_bytes:
// half in flight, half queued), so the live heap stays below it
// (config.SoftMemoryLimit).
func limitMemory(cfg *config.Config) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(cfg.SoftMemoryLimit())
	}
}

// run runs the relay of cfg, with its metrics and admin listener, until ctx
// is cancelled (nil) or a fatal error.
func run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	warnOfTrust(cfg, log)
	if cfg.Source == "poll" {
		return runPoll(ctx, cfg, log)
	}
	m := admin.New()
	rcfg, err := cfg.RelayConfig(log, kgo.WithHooks(m.KafkaHooks()...))
	if err != nil {
		return err
	}
	rcfg.Hooks = m.Hooks()
	watchRegistry(rcfg.Sink, m)
	if err := pingRegistry(ctx, rcfg.Sink, log); err != nil {
		return err
	}
	stopTracing, err := startTracing(ctx, cfg, &rcfg.Sink, m, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	if tc := rcfg.Sink.Transactions; tc != nil {
		tc.OnCommit, tc.OnAbort = m.TransactionHooks()
	}
	r, err := relay.New(rcfg)
	if err != nil {
		return err
	}
	m.Register(r)
	if cfg.Admin.Listen != "" {
		srv, err := admin.Serve(cfg.Admin.Listen, m.Mux(r, cfg.Postgres.Slot, cfg.Kafka.ExactlyOnce, cfg.Admin.Pprof), log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { m.PollSlot(pollCtx, r.ConnConfig(), cfg.Postgres.Slot, 5*time.Second, log) })
	bg.Go(func() { m.Watch(pollCtx, r, cfg.Log.ProgressInterval, log) })
	// The schema files, before any event (the watch above reports a
	// registry that does not answer).
	if err = registerSchemaFiles(ctx, cfg, rcfg.Sink.SchemaFirst, log); err == nil && ctx.Err() == nil {
		err = r.Run(ctx)
	}
	stopPoll()
	bg.Wait()
	return err
}

// runPoll runs the poll source of cfg (source poll), with its metrics and
// admin listener, until ctx is cancelled (nil) or a fatal error.
func runPoll(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	m := admin.New()
	pcfg, err := cfg.PollConfig(log, kgo.WithHooks(m.KafkaHooks()...))
	if err != nil {
		return err
	}
	pcfg.Hooks, pcfg.PollHooks = m.Hooks(), m.PollHooks()
	watchRegistry(pcfg.Sink, m)
	if err := pingRegistry(ctx, pcfg.Sink, log); err != nil {
		return err
	}
	stopTracing, err := startTracing(ctx, cfg, &pcfg.Sink, m, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	p, err := poll.New(pcfg)
	if err != nil {
		return err
	}
	m.Register(p)
	if cfg.Admin.Listen != "" {
		srv, err := admin.Serve(cfg.Admin.Listen, m.Mux(p, "", false, cfg.Admin.Pprof), log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	statsCtx, stopStats := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { m.PollTables(statsCtx, p.ConnConfig(), pcfg.Outbox, 5*time.Second, log) })
	bg.Go(func() { m.Watch(statsCtx, p, cfg.Log.ProgressInterval, log) })
	if err = registerSchemaFiles(ctx, cfg, pcfg.Sink.SchemaFirst, log); err == nil && ctx.Err() == nil {
		err = p.Run(ctx)
	}
	stopStats()
	bg.Wait()
	return err
}

// warnOfTrust logs, at start, each setting that trusts the network or the
// rows more than it should (config.TrustChecks; walrelay check prints the
// same lines).
func warnOfTrust(cfg *config.Config, log *slog.Logger) {
	for _, tc := range cfg.TrustChecks() {
		if !tc.OK {
			log.Warn(tc.Name+": "+tc.Detail, "check", tc.Name)
		}
	}
}

// startTracing sets up tracing (tracing.enabled) as the OTEL_* environment
// says, for the sink of sc, with its metric; stop exports what is queued
// (for 5 s at most) and stops it.
func startTracing(ctx context.Context, cfg *config.Config, sc *sink.Config, m *admin.Metrics, log *slog.Logger) (stop func(), err error) {
	t, err := tracing.New(ctx, tracing.Config{Enabled: cfg.Tracing.Enabled, RootSpans: cfg.Tracing.RootSpans, Logger: log})
	if err != nil || t == nil {
		return func() {}, err
	}
	sc.Tracer = t // only a non-nil one: a nil *Tracing in the interface is not nil
	m.RegisterTracing(t.Dropped)
	// The endpoint is not logged: it may hold credentials, as
	// OTEL_EXPORTER_OTLP_HEADERS does.
	if cfg.Tracing.RootSpans {
		log.Info("tracing: spans for every event (a new trace for one without a trace context, tracing.root_spans), exported by OTLP as the OTEL_* environment says")
	} else {
		log.Info("tracing: spans for events with a trace context, exported by OTLP as the OTEL_* environment says")
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(sctx); err != nil {
			log.Warn("tracing: spans not exported at shutdown", "err", err)
		}
	}, nil
}
