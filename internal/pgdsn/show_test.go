package pgdsn

import (
	"strings"
	"testing"
)

// TestShowNoPasswordTail: a URL whose password starts with digits and
// holds an unencoded / or ? parses (the digits as the port, the rest of
// the password as the database name or a run-time parameter): refused as
// unparseable, without any part of it, by Show and Check.
func TestShowNoPasswordTail(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:2024?Winter-Secret@db.example.com/shop",
		"postgres://app:2024/Winter-Secret@db.example.com/shop",
		"postgres://app:99?sslpassword=x&tail=Winter-Secret@db/shop",
		"postgresql://app:2024/Winter-Secret@db.example.com/shop",
	} {
		got := Show(dsn)
		if strings.Contains(got, "Winter") || strings.Contains(got, "2024") || !strings.HasPrefix(got, "unparseable DSN") {
			t.Errorf("Show(%q) = %q, want unparseable DSN without the password", dsn, got)
		}
		if err := Check(dsn); err == nil || strings.Contains(err.Error(), "Winter") || strings.Contains(err.Error(), "2024") {
			t.Errorf("Check(%q) = %v, want an error without the password", dsn, err)
		}
	}
}

// TestShowRuntimeParamValues: the values of run-time parameters are shown
// only for a few harmless, well-known ones; other parameters (a keyword
// pgconn does not know, such as oauth_client_secret or a misspelt
// password, or options) by name only.
func TestShowRuntimeParamValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ dsn, want string }{
		{"host=db.example.com user=app dbname=shop oauth_client_id=walrelay oauth_client_secret=S3cretValue", "oauth_client_secret=redacted"},
		{"host=db.example.com user=app dbname=shop passwd=S3cretValue", "passwd=redacted"},
		{"postgres://app@db.example.com/shop?Password=S3cretValue", "Password=redacted"},
		{"host=db user=app options='-c my.secret=S3cretValue'", "options=redacted"},
		{"host=db user=app application_name=walrelay-1 search_path=outbox", "application_name=walrelay-1"},
		{"host=db user=app application_name=walrelay-1 search_path=outbox", "search_path=outbox"},
	} {
		got := Show(c.dsn)
		if strings.Contains(got, "S3cretValue") || !strings.Contains(got, c.want) {
			t.Errorf("Show(%q) = %q, want %q in it and no secret", c.dsn, got, c.want)
		}
	}
	for _, dsn := range []string{"postgres://app@db/shop?application_name=a@b", "postgres://app:pw@db/shop?x/y=1"} {
		if err := Check(dsn); err == nil {
			t.Errorf("Check(%q): no error", dsn)
		}
	}
	for _, dsn := range []string{"postgres://app:pw@db/shop?application_name=a&my.setting=1", "host=db user=app", "postgres://app:p%40w@db:5433/shop", ""} {
		if err := Check(dsn); err != nil {
			t.Errorf("Check(%q): %v", dsn, err)
		}
	}
}
