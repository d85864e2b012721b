package admin

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// kafkaSilence is how long events may wait with no broker answering any
// request, the brokers connected, before walrelay says Kafka is not
// answering.
const kafkaSilence = 10 * time.Second

// kafkaState is what the brokers' last answers say: "" while they answer,
// else why walrelay takes them to be down, with since when.
func (m *Metrics) kafkaState(r Source, now time.Time) (problem string, since time.Time) {
	ok, fail := m.kafkaOK.Load(), m.kafkaFail.Load()
	if fail > ok {
		msg := "cannot connect to the brokers"
		if e, _ := m.kafkaErr.Load().(string); e != "" {
			msg += ": " + e
		}
		// Since the first failure after the last success.
		return msg, time.Unix(0, m.kafkaDownAt.Load())
	}
	if n := r.InFlight(); n > 0 && ok > 0 && now.Sub(time.Unix(0, ok)) >= kafkaSilence {
		return fmt.Sprintf("connected, but no answer for %s", now.Sub(time.Unix(0, ok)).Round(time.Second)), time.Unix(0, ok)
	}
	return "", time.Time{}
}

// waitingFor says what the pipeline waits for now, for the status screen.
func (m *Metrics) waitingFor(r Source, kafkaProblem string) string {
	switch state := r.State(); {
	case state == "waiting_for_slot":
		return "the slot: another instance streams it (this one takes over when it stops)"
	case state == "starting" && kafkaProblem != "":
		return "Kafka: walrelay starts once it answers (nothing is read before)"
	case state == "reconnecting" || state == "starting":
		return "PostgreSQL: connecting to stream the slot"
	case kafkaProblem != "":
		return fmt.Sprintf("Kafka: %d events held until it acknowledges them", r.InFlight())
	case r.InFlight() > 0:
		return fmt.Sprintf("Kafka's acknowledgement of %d events", r.InFlight())
	case state == "polling":
		return "new rows (polling)"
	case state == "streaming":
		return "new outbox rows"
	default:
		return state
	}
}

// Watch logs, in walrelay's own words, what an operator needs from a running
// pipeline, until ctx ends: when Kafka stops answering (no broker connects,
// or events wait while no broker answered for 10 s) and when it answers
// again, with what walrelay holds meanwhile; when the stream runs again
// after a reconnect, and after how long; and every progress (0: never) a
// progress line (events/s, in flight, the slot's lag and retained WAL),
// only every tenth time while idle (no event published, none in flight).
func (m *Metrics) Watch(ctx context.Context, r Source, progress time.Duration, log *slog.Logger) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var (
		kafkaDown, regDown   bool
		kafkaDownAt, lostAt  time.Time
		lastState            = r.State()
		lastReconnects       = r.Reconnects()
		lastProgress         = time.Now()
		lastPublished, idles int64
	)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			problem, since := m.kafkaState(r, now)
			switch {
			case problem != "" && !kafkaDown:
				kafkaDown, kafkaDownAt = true, since
				// failed_connects: the client's own lines about them are
				// folded (sink's logger adapter), so walrelay's carry
				// the count.
				log.Warn("Kafka is not answering: walrelay holds its events and retries; the slot's position stays before the first unacknowledged one",
					append([]any{"why", problem, "in_flight", r.InFlight(), "failed_connects", m.outageFails.Load()}, m.held(r)...)...)
			case problem == "" && kafkaDown:
				kafkaDown = false
				log.Info("Kafka answers again", "after", now.Sub(kafkaDownAt).Round(100*time.Millisecond), "in_flight", r.InFlight(),
					"failed_connects", m.outageFails.Load())
			}
			switch problem, wrong, since := m.registryProblem(); {
			case problem != "" && !regDown && wrong:
				regDown = true
				log.Error("the schema registry URL does not serve Confluent's Schema Registry API: a configuration problem (kafka.schema_registry.url; Apicurio serves the API at /apis/ccompat/v7): walrelay holds the events it cannot encode or check and retries; nothing is dropped",
					"why", problem, "since", since.UTC().Format(time.RFC3339), "in_flight", r.InFlight())
			case problem != "" && !regDown:
				regDown = true
				log.Warn("the schema registry is not answering: walrelay holds the events it cannot encode or check and retries; nothing is dropped",
					"why", problem, "since", since.UTC().Format(time.RFC3339), "in_flight", r.InFlight())
			case problem == "" && regDown:
				regDown = false
				log.Info("the schema registry answers again", "in_flight", r.InFlight())
			}
			// The stream went away if it left a working state, or if it
			// reconnected between two looks.
			state, reconnects := r.State(), r.Reconnects()
			if ready(lastState) && !ready(state) && state != "stopped" {
				lostAt = now
			}
			if ready(state) && (!lostAt.IsZero() || reconnects > lastReconnects) {
				attrs := []any{"state", state, "reconnects", reconnects}
				if !lostAt.IsZero() {
					attrs = append(attrs, "after", now.Sub(lostAt).Round(100*time.Millisecond))
				}
				log.Info("the stream runs again", attrs...)
				lostAt, lastReconnects = time.Time{}, reconnects
			}
			lastState = state
			if progress <= 0 || now.Sub(lastProgress) < progress {
				continue
			}
			// Idle: nothing published and nothing waiting to be. Events
			// in flight with none acknowledged are a stall (Kafka not
			// answering), logged every time.
			published, inFlight := m.publishedN.Load()+m.deadLetteredN.Load(), r.InFlight()
			if published == lastPublished && inFlight == 0 {
				if idles++; idles%10 != 1 {
					lastProgress = now
					continue
				}
			} else {
				idles = 0
			}
			rate := float64(published-lastPublished) / now.Sub(lastProgress).Seconds()
			lastProgress, lastPublished = now, published
			m.mu.Lock()
			lag, retained := m.lag, m.retain
			m.mu.Unlock()
			attrs := []any{"state", state, "events_per_s", fmt.Sprintf("%.1f", rate), "published", m.publishedN.Load(), "dead_lettered", m.deadLetteredN.Load(), "in_flight", inFlight}
			if lag != nil {
				attrs = append(attrs, "slot_lag", HumanBytes(*lag), "retained_wal", HumanBytes(*retained))
			}
			if idles > 0 {
				attrs = append(attrs, "idle", true)
			}
			log.Info("progress", attrs...)
		}
	}
}

// held returns, for the log, the position the slot is held at (source wal).
func (m *Metrics) held(r Source) []any {
	if w, ok := r.(positions); ok {
		return []any{"confirmed", w.ConfirmedLSN().String()}
	}
	return nil
}

// HumanBytes renders n bytes for people: 1.5 GiB.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if f < unit && f > -unit {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return fmt.Sprintf("%.1f PiB", f/unit)
}
