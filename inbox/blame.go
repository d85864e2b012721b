package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The kinds of blame for a transaction that failed in the inbox's own
// work after handlers ran in it.
const (
	// notHandlers: the database is down or restarted: retried, not
	// counted.
	notHandlers = iota
	// handlersFault: counted as the failure of the handler that caused
	// it (found by handling the batch's records one per transaction).
	handlersFault
	// sessionCut: the session ended, neither a restart nor a timeout the
	// handlers outlived explains it: pg_terminate_backend (an operator's,
	// or the handler's own on its backend: the two look the same), a
	// proxy, the network. Retried, not counted, up to maxCuts in a row.
	sessionCut
)

// maxCuts bounds the retries of a record whose session ends while its
// handler runs, for no cause that can be seen (sessionCut): a handler
// that ends its own backend is dead-lettered after as many runs, and an
// operator would have to end the same record's session that many times.
const maxCuts = 10

// blame says whose doing err is, the failure of a transaction in the
// inbox's own work after handlers ran in it, and why:
//   - not the connection's (a deferred constraint or a serialization
//     failure at the commit, a transaction a handler left aborted or
//     whose savepoint it released): the handlers';
//   - the connection's, and the database does not answer another
//     connection, or the server restarted since this worker last looked
//     (pg_postmaster_start_time changed; each worker keeps its own, so
//     every worker whose session one restart ended sees it): not the
//     handlers'. A worker that ran through a restart without a failure
//     takes its next failure of the connection for that restart, once
//     (retried, not counted);
//   - the server ended the session on idle_in_transaction_session_timeout
//     or transaction_timeout (SQLSTATE 25P03, 25P04), or a handler ran at
//     least idle_in_transaction_session_timeout, or the transaction lasted
//     at least transaction_timeout (as another connection of the pool
//     reads them): the handlers';
//   - else a cut from outside as far as can be seen (sessionCut).
func (w *worker) blame(err error) (int, string) {
	if !connectionTrouble(err) {
		return handlersFault, "the transaction itself failed: a deferred constraint or a serialization failure at the commit, or a transaction left aborted"
	}
	txAge := time.Since(w.txStart)
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	defer cancel()
	var started time.Time
	var idle, total int64
	if err := w.c.cfg.Postgres.QueryRow(ctx, `SELECT pg_postmaster_start_time(),
		coalesce((SELECT setting::int8 FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'), 0),
		coalesce((SELECT setting::int8 FROM pg_settings WHERE name = 'transaction_timeout'), 0)`).Scan(&started, &idle, &total); err != nil {
		return notHandlers, "the database does not answer"
	}
	// Each worker compares with the start time it last saw itself (when
	// created, the consumer's): one restart ends every worker's session,
	// and each must see it, not only the first to look.
	prev := w.pgStarted
	w.pgStarted = started
	w.c.serverStarted(started)
	if !prev.IsZero() && !prev.Equal(started) {
		return notHandlers, "the server restarted"
	}
	code := sqlState(err)
	if code == "" || strings.HasPrefix(code, "08") {
		code = w.handlerState
	}
	switch {
	case code == "25P03":
		return handlersFault, "the server ended its session on idle_in_transaction_session_timeout"
	case code == "25P04":
		return handlersFault, "the server ended its session on transaction_timeout"
	case idle > 0 && w.longestRun >= time.Duration(idle)*time.Millisecond:
		return handlersFault, fmt.Sprintf("a handler ran %s, at least idle_in_transaction_session_timeout (%dms)", w.longestRun.Round(time.Millisecond), idle)
	case total > 0 && txAge >= time.Duration(total)*time.Millisecond:
		return handlersFault, fmt.Sprintf("the transaction lasted %s, at least transaction_timeout (%dms)", txAge.Round(time.Millisecond), total)
	}
	return sessionCut, "the session ended from outside, as far as can be seen"
}

// sqlState is the SQLSTATE of the first *pgconn.PgError in err's tree,
// "" if none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// handlerError is the failure of a handler, whatever it wraps (io.EOF of
// an empty payload, a net.Error of a call to a service that is down): it
// counts an attempt and ends in the dead-letter topic after MaxAttempts.
// The inbox's own connection is known to be up when a handler's failure
// is reported: the savepoint was rolled back on it.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }

func (e *handlerError) Unwrap() error { return e.err }

// claimError is a failure of the inbox's own claim of an event (its
// handler did not run): dead-lettered, after MaxAttempts, as
// claim_failed, not handler_failed. An id the inbox table cannot hold (an
// index entry over the server's limit) is one.
type claimError struct{ err error }

func (e *claimError) Error() string { return e.err.Error() }

func (e *claimError) Unwrap() error { return e.err }

// isHandlerError reports whether err is a handler's failure.
func isHandlerError(err error) bool {
	var he *handlerError
	return errors.As(err, &he)
}

// connectionTrouble reports whether err, a failure of the inbox's own
// database work (never a handler's), is the connection's (or the
// network's) rather than a record's: retried without limit.
func connectionTrouble(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || strings.HasPrefix(pgErr.Code, "53")
	}
	var ne net.Error
	return errors.As(err, &ne) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "failed to connect")
}
