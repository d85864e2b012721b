package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// connRepeatQuiet is how long, after a line about a failed connection to a
// broker, its repeats for that broker are logged at DEBUG.
const connRepeatQuiet = time.Minute

// hintsBackAfter is how long a node that answered before may be away
// before the client's hints about it (TLS misconfigured?) are kept again:
// a restart or a cut lasts less; a node away longer may have changed its
// listener (TLS or SASL turned on, a certificate rotated), and the hint
// may be right.
const hintsBackAfter = 5 * time.Minute

// slogAdapter logs the client's messages through slog, and folds the
// client's lines about a node it cannot reach into walrelay's own. The
// client logs a line for every failed attempt to connect (hundreds in an
// outage of seconds), and more for a node that accepts the connection but
// closes it before it answers, as a node does while it restarts: "unable to
// request api versions" (ERROR) with a WARN line that asks "is TLS
// misconfigured?". For a node that answered before, those say only that it
// is away: the adapter logs "kafka node N (addr) is unreachable: cause;
// retrying" once at WARN, the client's lines at DEBUG, again at WARN after
// connRepeatQuiet or when the cause changes, and "kafka node N (addr) is
// back" at INFO when it answers again (its BrokerRead hook), counting what
// it folded. For a node that never answered, a failed dial is folded the
// same way, and the client's hints (TLS, SASL) keep their level the first
// time in connRepeatQuiet: then they may be right. Every other line of the
// client keeps its level.
type slogAdapter struct {
	l *slog.Logger

	mu sync.Mutex
	// A broker's state is by its address: the client connects to a
	// node under its seed id and its own, and logs both.
	ids   map[int32]*nodeState // by the client's broker id (seeds: math.MinInt32+i)
	addrs map[string]*nodeState
}

// nodeState is what the adapter knows of a broker's connections.
type nodeState struct {
	id       int32 // the broker's id: its own once known, else its seed id
	addr     string
	answered atomic.Bool // a request of the node was answered, ever
	away     atomic.Bool // a connection failed since its last answer
	since    time.Time   // the first failure since its last answer
	warned   time.Time   // the last line at WARN about it
	cause    string      // the root cause of that line
	folded   int         // failures since that line
	failures int         // failures since its last answer
	// The client's own lines about a node that never answered, by line
	// and cause: when each was last kept at its level, and how many
	// were folded since.
	hints map[string]*hintLine
}

// hintLine is one of the client's lines about a node that never answered.
type hintLine struct {
	kept   time.Time
	folded int
}

func newSlogAdapter(l *slog.Logger) *slogAdapter {
	return &slogAdapter{l: l, ids: map[int32]*nodeState{}, addrs: map[string]*nodeState{}}
}

func (a *slogAdapter) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case a.l.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelDebug
	case a.l.Enabled(ctx, slog.LevelInfo):
		return kgo.LogLevelInfo
	case a.l.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	default:
		return kgo.LogLevelError
	}
}

func (a *slogAdapter) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
		if msg == "unable to request api versions" && connectionFailure(keyvals) {
			l, keyvals = a.nodeFailed(time.Now(), l, msg, keyvals)
		}
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
		switch {
		case strings.HasPrefix(msg, "unable to open connection to broker due to an immediate EOF"),
			strings.HasPrefix(msg, "read from broker received EOF during api versions discovery"),
			strings.HasPrefix(msg, "read from broker errored, killing connection after 0 successful responses"):
			l, keyvals = a.nodeFailed(time.Now(), l, msg, keyvals)
		case strings.HasPrefix(msg, "unable to open connection to broker"):
			l, keyvals = a.nodeFailed(time.Now(), l, "", keyvals)
		}
	case kgo.LogLevelInfo:
		l = slog.LevelDebug // the client's info lines are per connection: too chatty for info
	}
	a.l.Log(context.Background(), l, msg, keyvals...)
}

// OnBrokerRead is the client's hook after it read an answer of a broker
// (kgo.HookBrokerRead): a node that was away is back.
func (a *slogAdapter) OnBrokerRead(meta kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	a.mu.Lock()
	n := a.ids[meta.NodeID]
	a.mu.Unlock()
	if n != nil && n.answered.Load() && !n.away.Load() {
		return // the common case: one map read under the lock
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n = a.node(meta.NodeID, net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))))
	n.answered.Store(true)
	if !n.away.Swap(false) {
		return
	}
	a.l.Info(fmt.Sprintf("kafka %s is back", n.name()), "node", logID(n.id), "addr", n.addr,
		"after", time.Since(n.since).Round(100*time.Millisecond), "failed_connects", n.failures)
	n.warned, n.cause, n.folded, n.failures = time.Time{}, "", 0, 0
}

// node returns the state of the broker at addr, or of id if addr is not
// known, created if new. a.mu must be held.
func (a *slogAdapter) node(id int32, addr string) *nodeState {
	if addr == "" {
		if n := a.ids[id]; n != nil {
			return n
		}
		n := &nodeState{id: id}
		a.ids[id] = n
		return n
	}
	n := a.addrs[addr]
	if n == nil {
		if n = a.ids[id]; n == nil || n.addr != "" {
			n = &nodeState{id: id}
		}
		n.addr = addr
		a.addrs[addr] = n
	}
	if a.ids[id] != n {
		a.ids[id] = n
	}
	if id >= -10 && id != -1 {
		n.id = id // its own id, not a seed's
	}
	return n
}

// nodeFailed returns the level, and keyvals, of the client's line at now
// about a failed connection to the node its keyvals name (broker, addr,
// err): DEBUG when walrelay's own line says it. A line that may say more
// (hint, the client's message: is TLS misconfigured, is SASL missing, the
// api versions that could not be asked) about a node that never answered
// keeps level, the first time of its message and cause in connRepeatQuiet,
// with the count of those folded since. Else it logs walrelay's line: the
// node is unreachable, at the first failure since its last answer, again
// after connRepeatQuiet or with a new cause.
func (a *slogAdapter) nodeFailed(now time.Time, level slog.Level, hint string, keyvals []any) (slog.Level, []any) {
	var id int32 = -1
	addr, cause := "", ""
	for i := 0; i+1 < len(keyvals); i += 2 {
		switch k, _ := keyvals[i].(string); k {
		case "addr":
			addr, _ = keyvals[i+1].(string)
		case "broker":
			id = parseLogID(keyvals[i+1])
		case "err":
			cause = causeOf(keyvals[i+1])
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.node(id, addr)
	if !n.away.Swap(true) {
		n.since, n.failures = now, 0
	}
	n.failures++
	restarting := n.answered.Load() && now.Sub(n.since) < hintsBackAfter
	if hint != "" && !restarting {
		// The client's line may be right: the node never answered, or
		// not for hintsBackAfter.
		return n.keepHint(now, level, hint+"|"+cause, keyvals)
	}
	repeat := !n.warned.IsZero() && now.Sub(n.warned) < connRepeatQuiet && cause == n.cause
	if repeat {
		n.folded++
		return slog.LevelDebug, keyvals
	}
	folded := n.folded
	n.warned, n.cause, n.folded = now, cause, 0
	attrs := []any{"node", logID(n.id), "addr", n.addr, "since", n.since.UTC().Format(time.RFC3339), "failed_connects", n.failures}
	if folded > 0 {
		attrs = append(attrs, "folded", folded)
	}
	what := "is unreachable"
	switch {
	case restarting:
		what = "answered before and is unreachable (restarting, or cut off)"
	case n.answered.Load():
		what = "answered before, but not for " + now.Sub(n.since).Round(time.Second).String() + ", and is unreachable (its listener changed, or it is down)"
	}
	a.l.Warn(fmt.Sprintf("kafka %s %s: %s; retrying (the client's lines about it at debug level for %s)", n.name(), what, cause, connRepeatQuiet), attrs...)
	return slog.LevelDebug, keyvals
}

// keepHint returns level and keyvals for the first of the client's line
// key in connRepeatQuiet, with the count folded since, else DEBUG.
func (n *nodeState) keepHint(now time.Time, level slog.Level, key string, keyvals []any) (slog.Level, []any) {
	if n.hints == nil {
		n.hints = map[string]*hintLine{}
	}
	h := n.hints[key]
	if h == nil {
		if len(n.hints) >= maxHintLines {
			clear(n.hints) // causes carry ports and addresses: bounded
		}
		h = &hintLine{}
		n.hints[key] = h
	}
	if !h.kept.IsZero() && now.Sub(h.kept) < connRepeatQuiet {
		h.folded++
		return slog.LevelDebug, keyvals
	}
	keyvals = append(keyvals, "repeats", "at debug level for "+connRepeatQuiet.String())
	if h.folded > 0 {
		keyvals = append(keyvals, "folded", h.folded)
	}
	h.kept, h.folded = now, 0
	return level, keyvals
}

// maxHintLines bounds the client's lines remembered per node.
const maxHintLines = 16

// causeOf is the cause of a failed connection for walrelay's line: the
// root cause (rootCause), or for a connection closed before its first
// answer one text whichever way the client tells it (EOF, or its
// ErrFirstReadEOF, whose text is the TLS hint).
func causeOf(v any) string {
	if err, ok := v.(error); ok {
		var eof *kgo.ErrFirstReadEOF
		if errors.As(err, &eof) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return "the connection closed before the node answered (EOF)"
		}
	}
	return rootCause(v)
}

// connectionFailure reports whether the err of keyvals is a connection
// that failed or closed (a node away), not a refusal of the node's.
func connectionFailure(keyvals []any) bool {
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, _ := keyvals[i].(string); k == "err" {
			err, _ := keyvals[i+1].(error)
			var eof *kgo.ErrFirstReadEOF
			var netErr net.Error
			return err != nil && (errors.As(err, &eof) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
				errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &netErr))
		}
	}
	return false
}

// name names a broker for walrelay's lines: "node 2 (host:port)", or
// "seed broker 0 (host:port)" before the client learnt its id.
func (n *nodeState) name() string {
	name := "node " + logID(n.id)
	if n.id < -10 {
		name = "seed broker " + strconv.Itoa(int(n.id-math.MinInt32))
	}
	if n.addr != "" {
		name += " (" + n.addr + ")"
	}
	return name
}

// logID is the client's name of a broker id in its lines (kgo's logID):
// the id, or seed_<i> for the i-th seed broker.
func logID(id int32) string {
	if id >= -10 {
		return strconv.Itoa(int(id))
	}
	return "seed_" + strconv.Itoa(int(id-math.MinInt32))
}

// parseLogID is the broker id of the client's name of it (logID); -1 if
// it is none.
func parseLogID(v any) int32 {
	s, _ := v.(string)
	if seed, ok := strings.CutPrefix(s, "seed_"); ok {
		if i, err := strconv.Atoi(seed); err == nil {
			return int32(math.MinInt32 + i)
		}
		return -1
	}
	if i, err := strconv.ParseInt(s, 10, 32); err == nil {
		return int32(i)
	}
	return -1
}

// rootCause is the text of the innermost error of v (an error, or
// anything else's text): the same for two failures of one cause even when
// the outer texts differ, as a reset's local port does.
func rootCause(v any) string {
	err, ok := v.(error)
	if !ok {
		return fmt.Sprint(v)
	}
	for {
		inner := errors.Unwrap(err)
		if inner == nil {
			return err.Error()
		}
		err = inner
	}
}
