package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walrelay/walrelay/relay"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cs := newConfigSet(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := cs.load(fs, true)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	log.Info("starting walrelay", append([]any{"version", version}, cs.effective()...)...)
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		// A soft limit: the collector works harder near it instead of
		// letting the heap double; what is in flight is bounded by the
		// producer's buffers (half of max_buffered_bytes queued, half in
		// flight, and the client's copy of the round), so the live heap
		// stays below it.
		debug.SetMemoryLimit(cfg.memoryLimit())
	}
	return scrubError(run(ctx, cfg, log), cfg.secrets())
}

// run runs the relay of cfg, with its metrics and admin listener, until ctx
// is cancelled (nil) or a fatal error.
func run(ctx context.Context, cfg *Config, log *slog.Logger) error {
	m := newMetrics()
	rcfg, err := cfg.relayConfig(log, kgo.WithHooks(kafkaHook{m}))
	if err != nil {
		return err
	}
	rcfg.Hooks = m.hooks()
	r, err := relay.New(rcfg)
	if err != nil {
		return err
	}
	m.register(r)
	if cfg.Admin.Listen != "" {
		srv, err := serveAdmin(cfg.Admin.Listen, adminMux(m, r, cfg.Postgres.Slot, m.kafkaReachable, cfg.Admin.Pprof), log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { m.pollSlot(pollCtx, cfg.Postgres.DSN, cfg.Postgres.Slot, 5*time.Second, log) })
	err = r.Run(ctx)
	stopPoll()
	bg.Wait()
	return err
}

// serveAdmin serves mux on addr until Close.
func serveAdmin(addr string, mux *http.ServeMux, log *slog.Logger) (*http.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped", "err", err)
		}
	}()
	log.Info("admin listener", "addr", l.Addr().String())
	return srv, nil
}
