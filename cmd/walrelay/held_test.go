package main

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/waitfor"
)

// heldCodes are the codes a healthy cluster answers with for a while:
// UNKNOWN_SERVER_ERROR first, then every code Kafka calls retriable but
// CORRUPT_MESSAGE (a refusal of one record of a batch: walrelay isolates and
// dead-letters it, docs/guarantees.md) and the unknown topic codes (the
// topic does not exist: a stop once the client's metadata says so).
func heldCodes() []int16 {
	codes := []int16{kerr.UnknownServerError.Code}
	for code := int16(1); code < 200; code++ {
		err := kerr.ErrorForCode(code)
		ke, ok := err.(*kerr.Error)
		if !ok || !ke.Retriable || code == kerr.CorruptMessage.Code || code == kerr.UnknownTopicOrPartition.Code || code == kerr.UnknownTopicID.Code {
			continue
		}
		codes = append(codes, code)
	}
	return codes
}

// refuseWindow has the broker answer every request of kind key with one of
// codes for d from now: the first half with codes[0] only, then with each
// code in turn. With every set, each code in turn from the start, and the
// window goes on past d until each was answered once (at most heldMax):
// some kinds are sent once per session, a few seconds apart while they
// fail. It returns the count of requests refused, and of codes answered in
// turn.
func refuseWindow(t *testing.T, fk *kafkatest.Cluster, key kmsg.Key, codes []int16, d time.Duration, every bool) (refused, cycled *atomic.Int64) {
	t.Helper()
	brokers := clusterBrokers(t, fk)
	refused, cycled = new(atomic.Int64), new(atomic.Int64)
	start := time.Now()
	fk.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
		since := time.Since(start)
		if since > heldMax || since > d && (!every || cycled.Load() >= int64(len(codes))) {
			return nil, nil, false // the window is over: the control is dropped
		}
		fk.KeepControl()
		turn := every || since > d/2
		code := codes[0]
		if turn {
			code = codes[int(cycled.Load())%len(codes)]
		}
		resp, ok := kafkatest.Refusal(req, code, brokers)
		if !ok {
			return nil, nil, false
		}
		refused.Add(1)
		if turn {
			cycled.Add(1)
		}
		return resp, nil, true
	})
	return refused, cycled
}

// heldMax bounds a window that waits for each code to be answered.
const heldMax = 3 * time.Minute

// clusterBrokers are the brokers a metadata answer names, for refused
// metadata answers to echo.
func clusterBrokers(t *testing.T, fk *kafkatest.Cluster) []kmsg.MetadataResponseBroker {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(fk.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatalf("metadata of the test's cluster: %v", err)
	}
	return resp.Brokers
}

// heldCase is one kind of request refused for a while, in one mode.
type heldCase struct {
	exactlyOnce bool
	key         kmsg.Key
	// restart: walrelay is stopped (cleanly) before the window and started
	// in it: the kind is sent at a start (the producer's id, the
	// coordinator's lookup, the offsets topic's reads, a topic's metadata).
	restart bool
}

func (c heldCase) name() string {
	mode := "at-least-once"
	if c.exactlyOnce {
		mode = "exactly-once"
	}
	if c.restart {
		mode += "/start"
	}
	return mode + "/" + c.key.Name()
}

// heldWindow is how long each case's broker refuses: several times what
// five sessions in a row take (about 1.5 s: the reconnect backoff starts at
// 100 ms), which stopped walrelay before.
const heldWindow = 8 * time.Second

// runHeld runs walrelay in c's mode while rows are written without pause,
// has the broker refuse c's kind of request for heldWindow, and checks that
// walrelay kept running and every committed row's id is on the topic, in
// order per key (and once each in exactly-once mode).
// With every, the window lasts until each of heldCodes was answered once.
func runHeld(t *testing.T, c heldCase, every bool) {
	pg, kc, col := setup(t)
	fk := kc.fake(t)
	e := baseEnv(pg, kc)
	if c.exactlyOnce {
		col = committedCollector(t, kc)
		e = eosEnv(pg, kc)
	}
	e = e.with("WALRELAY_ADMIN_LISTEN", freeAddr(t))
	conn := connect(t, pg.DSN)
	p := streaming(t, e)
	w := newWriter(30, 48)
	w.bytes = 100
	stop := w.keepWriting(t.Context(), pg.DSN)
	time.Sleep(time.Second)
	if c.restart {
		p.signal(syscall.SIGTERM)
		if code := p.exit(30 * time.Second); code != 0 {
			t.Fatalf("walrelay stopped with exit %d:\n%s", code, tail(p.out.String(), 3000))
		}
	}
	codes := heldCodes()
	windowAt := time.Now()
	refused, cycled := refuseWindow(t, fk, c.key, codes, heldWindow, every)
	if c.restart {
		p = start(t, e, "run")
	}
	time.Sleep(heldWindow * 3 / 4)
	if c.key == kmsg.Produce {
		// What the operator sees while the broker refuses events.
		code, status := runCmd(t, e, "status")
		if code != 0 || !strings.Contains(status, "kafka refuses") || !strings.Contains(status, "held and retried for as long as it lasts") {
			t.Errorf("walrelay status while the broker refuses events (exit %d) does not say so:\n%s", code, status)
		}
		if !strings.Contains(p.out.String(), `msg="kafka refuses an event: walrelay holds it and retries`) {
			t.Errorf("the log does not say that the broker refuses events:\n%s", tail(p.out.String(), 3000))
		}
	}
	time.Sleep(heldWindow/4 + time.Second)
	for every && cycled.Load() < int64(len(codes)) && time.Since(windowAt) < heldMax {
		time.Sleep(100 * time.Millisecond)
	}
	if c.restart {
		p.waitLog("msg=streaming", time.Minute)
	}
	if n := stop(); n != 0 {
		t.Fatalf("%d writes failed", n)
	}
	select {
	case <-p.done:
		t.Fatalf("walrelay exited while the broker refused %s:\n%s", c.key.Name(), tail(p.out.String(), 4000))
	default:
	}
	want := committedIDs(t, conn)
	tl := waitAll(t, col, want, 2*time.Minute)
	t.Logf("%s: %d requests refused over %s, %d of them with each of %d codes in turn; %d rows: %s", c.name(), refused.Load(), heldWindow, cycled.Load(), len(codes), len(want), tl)
	if tl.orderViolations != 0 || tl.missing != 0 || (c.exactlyOnce && tl.duplicates != 0) {
		t.Fatalf("after the broker refused %s for %s: %s", c.key.Name(), heldWindow, tl)
	}
	if refused.Load() == 0 {
		t.Fatalf("no %s request met the window: the test injected nothing", c.key.Name())
	}
	if every && cycled.Load() < int64(len(codes)) {
		t.Fatalf("%d %s requests were answered with the codes in turn within %s, fewer than the %d codes", cycled.Load(), c.key.Name(), heldMax, len(codes))
	}
	select {
	case <-p.done:
		t.Fatalf("walrelay exited after the broker refused %s:\n%s", c.key.Name(), tail(p.out.String(), 4000))
	default:
	}
}

// TestHeldRefusals: for 8 s the broker answers produce requests with
// UNKNOWN_SERVER_ERROR, then with each code Kafka calls retriable, in turn,
// in both modes: walrelay holds its events and retries (it stopped after
// about 1.5 s before: five sessions in a row), and afterwards every
// committed row's id is on the topic, in order per key.
func TestHeldRefusals(t *testing.T) {
	t.Parallel()
	for _, c := range []heldCase{{key: kmsg.Produce}, {exactlyOnce: true, key: kmsg.Produce}} {
		t.Run(c.name(), func(t *testing.T) {
			t.Parallel()
			runHeld(t, c, false)
		})
	}
}

// TestHeldRefusalsEveryKind is TestHeldRefusals for each kind of request
// walrelay sends, each window lasting until every code was answered once,
// in both modes: produce; metadata; in exactly-once mode the
// transactions' (InitProducerID, EndTxn, the coordinator's lookup) and the
// offsets topic's reads (Fetch); those sent at a start meet a
// window that a start of walrelay falls in. kfake speaks Kafka's
// transactions of version 2 (KIP-890), in which the client sends no
// AddPartitionsToTxn: that kind is not met here.
func TestHeldRefusalsEveryKind(t *testing.T) {
	long(t) // eight cases, windows of 8 s and more
	t.Parallel()
	for _, c := range []heldCase{
		{key: kmsg.Produce},
		{exactlyOnce: true, key: kmsg.Produce},
		{key: kmsg.Metadata, restart: true},
		{exactlyOnce: true, key: kmsg.EndTxn},
		{exactlyOnce: true, key: kmsg.Metadata, restart: true},
		{exactlyOnce: true, key: kmsg.InitProducerID, restart: true},
		{exactlyOnce: true, key: kmsg.FindCoordinator, restart: true},
		{exactlyOnce: true, key: kmsg.Fetch, restart: true},
	} {
		t.Run(c.name(), func(t *testing.T) {
			t.Parallel()
			runHeld(t, c, true)
		})
	}
}

// TestPollHeldRefusalIsNotAnAttempt: with poll.max_attempts 1, the broker
// answering the event's topic with UNKNOWN_SERVER_ERROR for 4 s (the
// dead-letter topic answering) holds the row: it is sent once the window
// ends, not made DEAD. Before, the answer counted as an attempt: the row
// went to the dead-letter topic (max_attempts) at the first.
func TestPollHeldRefusalIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	pg, kc, col := setupPoll(t)
	fk := kc.fake(t)
	conn := connect(t, pg.DSN)
	topic := kc.topic("order")
	createTopic(t, kc.Addrs(), topic, nil)
	createTopic(t, kc.Addrs(), kc.dlq(), nil)
	// A produce request names its topics by id (Produce v13 on).
	admin, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	listed, err := kadm.NewClient(admin).ListTopics(t.Context(), topic)
	if err != nil || listed[topic].Err != nil {
		t.Fatalf("list topic %s: %v %v", topic, err, listed[topic].Err)
	}
	topicID := listed[topic].ID
	polling(t, pollEnv(pg, kc).with("WALRELAY_POLL_MAX_ATTEMPTS", "1"))
	began := time.Now()
	var refused atomic.Int64
	fk.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if time.Since(began) > 4*time.Second {
			return nil, nil, false // the window is over: the control is dropped
		}
		fk.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		for _, tp := range pr.Topics {
			if tp.Topic == topic || tp.TopicID == topicID {
				refused.Add(1)
				return kafkatest.RefuseProduce(pr, kerr.UnknownServerError.Code), nil, true
			}
		}
		return nil, nil, false
	})
	id := insertRow(t, conn, "order", "A", 0)
	waitfor.Until(t, time.Minute, "the row sent or dead", func() bool {
		s := rowStatus(t, conn, id)
		return s == "SENT" || s == "DEAD"
	})
	if s := rowStatus(t, conn, id); s != "SENT" || refused.Load() == 0 {
		t.Fatalf("the row is %s after %d refusals, want SENT once the window ended", s, refused.Load())
	}
	if r := recordOf(col, id); r == nil || r.Topic != topic {
		t.Fatalf("the row's record: %v, want it on %s", r, topic)
	}
}
