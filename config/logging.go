package config

import (
	"errors"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
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

var (
	// secretParam matches a connection parameter that carries a secret
	// (libpq's password and sslpassword), in key=value form or in a URL's
	// query, quoted or not.
	secretParam = regexp.MustCompile(`(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	urlPassword = regexp.MustCompile(`(://[^:/@\s]*:)([^@\s]*)@`)
)

// RedactDSN hides every secret of a URL or key=value connection string (the
// password in the URL's user part, password= and sslpassword= anywhere),
// also of one that does not parse.
func RedactDSN(dsn string) string {
	dsn = urlPassword.ReplaceAllString(dsn, "${1}redacted@")
	return secretParam.ReplaceAllString(dsn, "${1}redacted")
}

// dsnHasPassword reports whether dsn itself carries a password (not
// sslpassword, and not one from the environment).
func dsnHasPassword(dsn string) bool {
	if urlPassword.MatchString(dsn) {
		return true
	}
	for _, m := range secretParam.FindAllStringSubmatch(dsn, -1) {
		if strings.HasPrefix(strings.ToLower(m[1]), "password") {
			return true
		}
	}
	return false
}

// dsnPasswords returns the secrets written in dsn, as written and decoded,
// to scrub from errors that quote it; and the password pgconn's parser
// finds (which also reads PGPASSWORD).
func dsnPasswords(dsn string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if d, err := url.QueryUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
		if e := url.QueryEscape(s); e != s {
			out = append(out, e)
		}
	}
	for _, m := range urlPassword.FindAllStringSubmatch(dsn, -1) {
		add(m[2])
	}
	for _, m := range secretParam.FindAllStringSubmatch(dsn, -1) {
		add(strings.Trim(m[2], "'"))
	}
	if c, err := pgconn.ParseConfig(dsn); err == nil {
		add(c.Password)
	}
	return out
}

// ScrubError is err with every secret replaced (Config.Secrets): the
// drivers quote a connection string that does not parse.
func ScrubError(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
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
