package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// connRepeatQuiet is how long, after the client's WARN line about a failed
// connection to a broker, its repeats for that broker are logged at DEBUG.
const connRepeatQuiet = time.Minute

// slogAdapter logs the client's messages through slog. The client logs a
// WARN line for every failed attempt to connect (hundreds in an outage of
// seconds, beside walrelay's own line that Kafka is not answering): the
// adapter logs the first of each broker at WARN, the repeats within
// connRepeatQuiet at DEBUG, and the next WARN line says how many it folded.
// A repeat is a failure of the same broker with the same cause: one whose
// cause differs from the last WARN line's (refused, then a certificate not
// trusted) is at WARN at once.
type slogAdapter struct {
	l *slog.Logger

	mu     sync.Mutex
	failed map[string]*connFailures // by broker address
}

// connFailures are a broker's failed connections since the adapter last
// logged one at WARN.
type connFailures struct {
	warned time.Time
	cause  string // the root cause of the last WARN line
	folded int
}

func newSlogAdapter(l *slog.Logger) *slogAdapter {
	return &slogAdapter{l: l, failed: map[string]*connFailures{}}
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
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
		if strings.HasPrefix(msg, "unable to open connection to broker") {
			l, keyvals = a.foldConnFailure(time.Now(), keyvals)
		}
	case kgo.LogLevelInfo:
		l = slog.LevelDebug // the client's info lines are per connection: too chatty for info
	}
	a.l.Log(context.Background(), l, msg, keyvals...)
}

// foldConnFailure returns the level of a failed connection's line at now:
// WARN for the first of its broker (keyvals' addr) in connRepeatQuiet, with
// the count of those folded since the last one, else DEBUG.
func (a *slogAdapter) foldConnFailure(now time.Time, keyvals []any) (slog.Level, []any) {
	addr, cause := "", ""
	for i := 0; i+1 < len(keyvals); i += 2 {
		switch k, _ := keyvals[i].(string); k {
		case "addr":
			addr, _ = keyvals[i+1].(string)
		case "err":
			cause = rootCause(keyvals[i+1])
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.failed[addr]
	if f == nil {
		f = &connFailures{}
		a.failed[addr] = f
	}
	if !f.warned.IsZero() && now.Sub(f.warned) < connRepeatQuiet && cause == f.cause {
		f.folded++
		return slog.LevelDebug, keyvals
	}
	keyvals = append(keyvals, "repeats", "at debug level for "+connRepeatQuiet.String())
	if f.folded > 0 {
		keyvals = append(keyvals, "folded", f.folded)
	}
	f.warned, f.cause, f.folded = now, cause, 0
	return slog.LevelWarn, keyvals
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
