package config

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/pgdsn"
)

// NewLogger returns the logger of cfg's log.level and log.format, writing
// to w.
func NewLogger(cfg *Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // validated
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// RedactDSN returns the connection that dsn describes, rebuilt from
// pgconn's parse without its secrets, or "unparseable DSN" and pgconn's
// reason without any part of dsn (pgdsn.Show).
func RedactDSN(dsn string) string { return pgdsn.Show(dsn) }

// DSNError returns pgconn's failure to parse a DSN without any part of the
// DSN (pgdsn.ParseError).
func DSNError(err error) error { return pgdsn.ParseError(err) }

// dsnPassword returns the password pgconn's parser finds for dsn.
func dsnPassword(dsn string) string { return pgdsn.Password(dsn) }

// dsnHasPassword reports whether dsn gives a password of its own: one
// pgconn's parser finds that is not PGPASSWORD's (written in the DSN, or
// from its service file or passfile).
func dsnHasPassword(dsn string) bool {
	pw := dsnPassword(dsn)
	return pw != "" && pw != os.Getenv("PGPASSWORD")
}

// ScrubError is err made safe to print: a ParseConfigError anywhere in its
// chain is replaced by DSNError's text (pgconn's message quotes the DSN),
// and then every one of secrets (Config.Secrets, the values themselves as
// parsed) that its text still holds is replaced by "redacted".
func ScrubError(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if strings.Contains(msg, pe.Error()) {
			msg = strings.ReplaceAll(msg, pe.Error(), DSNError(pe).Error())
		} else {
			msg = DSNError(pe).Error() // wrapped in a way that changed its text
		}
	}
	for _, p := range secrets {
		if len(p) >= 3 {
			msg = strings.ReplaceAll(msg, p, "redacted")
		}
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}
