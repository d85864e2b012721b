package main

import (
	"errors"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
)

func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // validated
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

var (
	kvPassword  = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
	urlPassword = regexp.MustCompile(`(://[^:/@\s]*:)([^@\s]*)@`)
)

// redactDSN hides the password of a URL or key=value connection string,
// also of one that does not parse.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "redacted")
		}
		return u.String()
	}
	dsn = urlPassword.ReplaceAllString(dsn, "${1}redacted@")
	return kvPassword.ReplaceAllString(dsn, "${1}redacted")
}

// dsnPasswords returns the passwords written in dsn, to scrub from errors
// that quote it.
func dsnPasswords(dsn string) []string {
	var out []string
	for _, m := range urlPassword.FindAllStringSubmatch(dsn, -1) {
		if m[2] != "" {
			out = append(out, m[2], url.QueryEscape(m[2]))
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		out = append(out, strings.Trim(m[2], "'"))
	}
	return out
}

// scrubError is err with every secret replaced (Config.secrets): the
// drivers quote a connection string that does not parse.
func scrubError(err error, secrets []string) error {
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
