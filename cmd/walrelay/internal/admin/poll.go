package admin

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/walrelay/walrelay/decoder"
	"github.com/walrelay/walrelay/poll"
	"github.com/walrelay/walrelay/relay"
)

// PollHooks are the poller's hooks that count (source poll); they register
// the poll metrics.
func (m *Metrics) PollHooks() poll.Hooks {
	m.pollRows = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walrelay_poll_rows", Help: "Source poll: unsent rows of each outbox table by state (due: claimable now; pending, sending, expired_lease, dead, parked: behind a blocked row of their aggregate), read every 5 s."}, []string{"table", "state"})
	m.pollAge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walrelay_poll_oldest_due_seconds", Help: "Source poll: age (by created_at) of the oldest row that may be claimed now; 0 when none."}, []string{"table"})
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	m.pollClaim = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "walrelay_poll_claim_seconds", Help: "Source poll: how long a claim transaction took (with the release of parked rows before it).", Buckets: buckets}, []string{"table"})
	m.pollMark = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "walrelay_poll_mark_seconds", Help: "Source poll: how long a mark statement took.", Buckets: buckets}, []string{"table"})
	m.pollRowsN = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_poll_rows_total", Help: "Source poll: rows by what happened to them: claimed (an attempt), lease_expired (claimed after another claim's lease ended), sent, retried (back to PENDING after a failure), dead, lost_claim (marked by no one: claimed again meanwhile, so sent twice), released (PARKED rows set back to PENDING before a claim)."}, []string{"table", "event"})
	m.pollRelErr = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_poll_release_errors_total", Help: "Source poll: releases of parked rows that failed (the claim ran all the same; the next round tries again)."}, []string{"table"})
	m.reg.MustRegister(m.pollRows, m.pollAge, m.pollClaim, m.pollMark, m.pollRowsN, m.pollRelErr)
	return poll.Hooks{
		Claimed: func(table string, rows, expired int, took time.Duration) {
			m.pollClaim.WithLabelValues(table).Observe(took.Seconds())
			m.pollRowsN.WithLabelValues(table, "claimed").Add(float64(rows))
			m.pollRowsN.WithLabelValues(table, "lease_expired").Add(float64(expired))
		},
		Released: func(table string, rows int64, err error) {
			if err != nil {
				m.pollRelErr.WithLabelValues(table).Inc()
				return
			}
			m.pollRowsN.WithLabelValues(table, "released").Add(float64(rows))
		},
		Marked: func(table string, took time.Duration, sent, retried, dead, lost int) {
			m.pollMark.WithLabelValues(table).Observe(took.Seconds())
			m.pollRowsN.WithLabelValues(table, "sent").Add(float64(sent))
			m.pollRowsN.WithLabelValues(table, "retried").Add(float64(retried))
			m.pollRowsN.WithLabelValues(table, "dead").Add(float64(dead))
			m.pollRowsN.WithLabelValues(table, "lost_claim").Add(float64(lost))
		},
	}
}

// PollTables reads the outbox tables' rows by state every interval until
// ctx ends, on a connection of its own (source poll; after PollHooks).
func (m *Metrics) PollTables(ctx context.Context, connCfg *pgx.ConnConfig, o decoder.Config, every time.Duration, log *slog.Logger) {
	relay.Periodically(ctx, connCfg, every, func(ctx context.Context, conn *pgx.Conn) error {
		st, err := poll.ReadStats(ctx, conn, o)
		if err != nil {
			return err
		}
		for _, s := range st {
			for state, n := range map[string]int64{"due": s.Due, "pending": s.Pending, "sending": s.Sending, "expired_lease": s.ExpiredLeases, "dead": s.Dead, "parked": s.Parked} {
				m.pollRows.WithLabelValues(s.Table, state).Set(float64(n))
			}
			m.pollAge.WithLabelValues(s.Table).Set(s.OldestDueSeconds)
		}
		m.mu.Lock()
		m.pollStats, m.slotErr = st, ""
		m.mu.Unlock()
		return nil
	}, func(err error) {
		m.mu.Lock()
		m.slotErr = err.Error()
		m.mu.Unlock()
		log.Debug("read the outbox's rows by state", "err", err)
	})
}
