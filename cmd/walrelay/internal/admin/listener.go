package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/walrelay/walrelay/relay"

	"github.com/walrelay/walrelay/poll"
)

// Status is what /status serves and `walrelay status` prints.
type Status struct {
	State string `json:"state"`
	// Source is wal or poll.
	Source              string  `json:"source"`
	Slot                string  `json:"slot,omitempty"`
	SlotLagBytes        *int64  `json:"slot_lag_bytes"`
	RetainedWALBytes    *int64  `json:"retained_wal_bytes"`
	ReceivedLSN         string  `json:"received_lsn,omitempty"`
	ConfirmedLSN        string  `json:"confirmed_lsn,omitempty"`
	EventsPerSecond     float64 `json:"events_per_second"`
	InFlight            int     `json:"in_flight_events"`
	Published           int64   `json:"events_published"`
	DeadLettered        int64   `json:"events_dead_lettered"`
	SecondsBehindSource float64 `json:"seconds_behind_source"`
	// ExactlyOnce is set in exactly-once mode.
	ExactlyOnce *ExactlyOnceStatus `json:"exactly_once,omitempty"`
	// Poll is the outbox tables' rows by state, with source poll.
	Poll []poll.Stats `json:"poll,omitempty"`
	// Kafka is what the brokers' last answers say.
	Kafka KafkaStatus `json:"kafka"`
	// SchemaRegistry is what the schema registry's last answers say, with
	// a registry format.
	SchemaRegistry *RegistryStatus `json:"schema_registry,omitempty"`
	// WaitingFor says what the pipeline waits for now.
	WaitingFor string `json:"waiting_for"`
	Error      string `json:"error,omitempty"`
}

// KafkaStatus is whether the brokers answer, and if not, why walrelay takes
// them to be down and since when.
type KafkaStatus struct {
	Answering bool   `json:"answering"`
	Problem   string `json:"problem,omitempty"`
	Since     string `json:"since,omitempty"` // RFC 3339
	// Refusing is the broker's refusal of an event that walrelay holds
	// and retries, while the last sessions in a row ended on it.
	Refusing *RefusingStatus `json:"refusing,omitempty"`
}

// RefusingStatus is a refusal of the broker's that walrelay holds and
// retries (relay.Refusal).
type RefusingStatus struct {
	LSN      string `json:"lsn"`
	Code     string `json:"code"`
	Error    string `json:"error"`
	Since    string `json:"since"` // RFC 3339
	Sessions int    `json:"sessions"`
	// Persistent: a code no healthy cluster answers with for long;
	// walrelay stops once StopsAfter says. Else it is held for as long as
	// it lasts.
	Persistent bool   `json:"persistent"`
	StopsAfter string `json:"stops_after,omitempty"`
}

// refusals is a relay that tells the broker's refusal it holds.
type refusals interface {
	Refusal() (relay.Refusal, bool)
}

func refusingStatus(r Source) *RefusingStatus {
	rf, ok := r.(refusals)
	if !ok {
		return nil
	}
	x, ok := rf.Refusal()
	if !ok {
		return nil
	}
	st := &RefusingStatus{LSN: x.At.String(), Code: x.Code, Error: x.Err, Since: x.Since.UTC().Format(time.RFC3339), Sessions: x.Sessions, Persistent: x.Persistent}
	if x.Persistent {
		st.StopsAfter = x.StopsAfter
	}
	return st
}

// ExactlyOnceStatus is the state of exactly-once mode's Kafka transactions.
type ExactlyOnceStatus struct {
	CommittedPosition     string `json:"committed_position"`
	TransactionsCommitted int64  `json:"transactions_committed"`
	TransactionsAborted   int64  `json:"transactions_aborted"`
}

// Mux serves /healthz, /readyz, /metrics, /status (with the transactions'
// state if exactlyOnce) and, if withPprof, /debug/pprof, for the relay r of
// slot, or the poller r (slot empty). Each answers GET and HEAD only: the
// mux answers another method with 405 Method Not Allowed and an Allow
// header (GET patterns), as nothing on the listener changes anything.
func (m *Metrics) Mux(r Source, slot string, exactlyOnce, withPprof bool) *http.ServeMux {
	kafkaOK := m.kafkaReachable
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		state := r.State()
		// ?standby=1: an instance waiting for the slot another one streams
		// is ready too (a healthy standby), so that a rolling update of
		// two replicas can go on.
		standby := req.URL.Query().Get("standby") != "" && state == "waiting_for_slot"
		ok := (ready(state) || standby) && r.Err() == nil && kafkaOK()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": ok, "state": state, "kafka_reachable": kafkaOK()})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		m.mu.Lock()
		doc := Status{State: r.State(), Source: "wal", Slot: slot, SlotLagBytes: m.lag, RetainedWALBytes: m.retain, Error: m.slotErr, Poll: m.pollStats}
		m.mu.Unlock()
		if w, ok := r.(positions); ok {
			doc.ReceivedLSN = w.ReceivedLSN().String()
			doc.ConfirmedLSN = w.ConfirmedLSN().String()
		} else {
			doc.Source = "poll"
		}
		doc.EventsPerSecond = m.rate()
		doc.InFlight = r.InFlight()
		doc.Published = m.publishedN.Load()
		doc.DeadLettered = m.deadLetteredN.Load()
		doc.SecondsBehindSource = m.behind(r)
		problem, since := m.kafkaState(r, time.Now())
		doc.Kafka = KafkaStatus{Answering: problem == "", Problem: problem, Refusing: refusingStatus(r)}
		if problem != "" {
			doc.Kafka.Since = since.UTC().Format(time.RFC3339)
		}
		doc.WaitingFor = m.waitingFor(r, problem)
		if doc.SchemaRegistry = m.registryStatus(); doc.SchemaRegistry != nil && !doc.SchemaRegistry.Answering && problem == "" {
			doc.WaitingFor = "the schema registry: events held until it answers (the stream resumes from the confirmed position then)"
			if doc.SchemaRegistry.WrongURL {
				doc.WaitingFor = "the schema registry: its URL (kafka.schema_registry.url) does not serve Confluent's Schema Registry API, a configuration problem; events held until it does (the stream resumes from the confirmed position then)"
			}
		}
		if exactlyOnce {
			pos, _ := m.committedPos.Load().(string)
			doc.ExactlyOnce = &ExactlyOnceStatus{CommittedPosition: pos, TransactionsCommitted: m.txnCommitted.Load(), TransactionsAborted: m.txnAborted.Load()}
		}
		if err := r.Err(); err != nil {
			doc.Error = err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(doc)
	})
	if withPprof {
		mux.HandleFunc("GET /debug/pprof/", boundedProfile(pprof.Index)) // named profiles: ?seconds= gives a delta
		mux.HandleFunc("GET /debug/pprof/profile", boundedProfile(pprof.Profile))
		mux.HandleFunc("GET /debug/pprof/trace", boundedProfile(pprof.Trace))
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	}
	return mux
}

// MaxProfileDuration is the longest profile or trace the admin listener
// takes (?seconds=); a longer one is refused with 400. The listener's write
// timeout leaves room for it.
const MaxProfileDuration = 30 * time.Second

// boundedProfile refuses a request whose ?seconds= is over
// MaxProfileDuration before h starts the profile: without a bound, anyone
// who reaches the port could hold a CPU profile (one at a time for the
// whole process) or a trace for hours.
func boundedProfile(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.FormValue("seconds"); v != "" {
			if sec, err := strconv.ParseFloat(v, 64); err == nil && (sec > MaxProfileDuration.Seconds() || math.IsNaN(sec)) {
				http.Error(w, fmt.Sprintf("seconds=%s: a profile or trace lasts at most %d seconds on this listener", v, int(MaxProfileDuration.Seconds())), http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	}
}

// timeouts bound the admin listener's connections.
type timeouts struct {
	readHeader, read, write, idle time.Duration
}

// listenerTimeouts are the admin listener's: a request (a GET without a
// body) is read within 10 s; an answer is written within the longest
// profile and 10 s more; a keep-alive connection idle for 10 s is closed,
// so that idle connections cannot pile up (a scraper opens a new one, at
// the cost of a handshake per scrape).
var listenerTimeouts = timeouts{readHeader: 5 * time.Second, read: 10 * time.Second, write: MaxProfileDuration + 10*time.Second, idle: 10 * time.Second}

// Serve serves mux on addr until Close, with listenerTimeouts.
func Serve(addr string, mux *http.ServeMux, log *slog.Logger) (*http.Server, error) {
	return serve(addr, mux, listenerTimeouts, log)
}

func serve(addr string, mux *http.ServeMux, to timeouts, log *slog.Logger) (*http.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %s: %w", addr, err)
	}
	srv := &http.Server{Addr: l.Addr().String(), Handler: mux, ReadHeaderTimeout: to.readHeader, ReadTimeout: to.read, WriteTimeout: to.write, IdleTimeout: to.idle}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener stopped", "err", err)
		}
	}()
	log.Info("admin listener", "addr", l.Addr().String())
	return srv, nil
}
