package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	handled, duplicates, retries *prometheus.CounterVec
	deadLettered                 *prometheus.CounterVec
	commits                      prometheus.Counter
	latency                      prometheus.Histogram
	lag                          *prometheus.GaugeVec
	registryWaits                *prometheus.CounterVec
	registryHeld                 *prometheus.GaugeVec
	versionStale, versionMissing *prometheus.CounterVec
	versionWaiting               *prometheus.GaugeVec
}

// newMetrics makes the consumer's metrics, labelled with its name, and
// registers them on reg if it is set.
func newMetrics(reg prometheus.Registerer, consumer string) (*metrics, error) {
	l := prometheus.Labels{"consumer": consumer}
	m := &metrics{
		handled:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_handled_total", Help: "Events handled (their transaction committed).", ConstLabels: l}, []string{"topic"}),
		duplicates:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_duplicates_total", Help: "Records skipped because the inbox holds their event id.", ConstLabels: l}, []string{"topic"}),
		retries:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_retries_total", Help: "Handler failures retried.", ConstLabels: l}, []string{"topic"}),
		deadLettered:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_dead_lettered_total", Help: "Records sent to the dead-letter topic, by reason (handler_failed, claim_failed, undecodable, no_id, empty_id, several_ids, invalid_version, version_gap).", ConstLabels: l}, []string{"topic", "reason"}),
		commits:        prometheus.NewCounter(prometheus.CounterOpts{Name: "walrelay_inbox_db_commits_total", Help: "Database transactions committed (each holds a batch of records).", ConstLabels: l}),
		latency:        prometheus.NewHistogram(prometheus.HistogramOpts{Name: "walrelay_inbox_handler_seconds", Help: "Time the handler took per record.", ConstLabels: l, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		lag:            prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walrelay_inbox_lag_records", Help: "Records of a partition after the last one handled, as of the last fetch.", ConstLabels: l}, []string{"topic", "partition"}),
		registryWaits:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_registry_waits_total", Help: "Retries of a record held because the schema registry did not give its schema, by reason (credentials: 401 or 403, a configuration to mend; unavailable: an outage).", ConstLabels: l}, []string{"topic", "reason"}),
		registryHeld:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walrelay_inbox_registry_held", Help: "1 while a partition is held on the schema registry (its head record waits for a schema), else 0.", ConstLabels: l}, []string{"topic", "partition"}),
		versionStale:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_version_stale_total", Help: "Events skipped (VersionOrder) because their aggregate's version handled is at or above theirs.", ConstLabels: l}, []string{"topic"}),
		versionMissing: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walrelay_inbox_version_missing_total", Help: "Events handled without the walrelay.aggregate_version header while VersionOrder is on: not ordered.", ConstLabels: l}, []string{"topic"}),
		versionWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "walrelay_inbox_version_waiting", Help: "Events of a partition waiting (VersionOrder, up to VersionWait) for the versions before theirs.", ConstLabels: l}, []string{"topic", "partition"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.handled, m.duplicates, m.retries, m.deadLettered, m.commits, m.latency, m.lag, m.registryWaits, m.registryHeld, m.versionStale, m.versionMissing, m.versionWaiting} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("inbox: register metrics: %w", err)
		}
	}
	return m, nil
}
