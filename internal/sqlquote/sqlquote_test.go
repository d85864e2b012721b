package sqlquote_test

import (
	"testing"

	"github.com/walrelay/walrelay/internal/sqlquote"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// TestLiteralUnderBothSettings: a literal reads back as the value written,
// through the simple query protocol (several statements in one string, as
// Exec without arguments sends them), with standard_conforming_strings on
// and off.
func TestLiteralUnderBothSettings(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	conn := pgtest.Connect(t, pg.DSN)
	values := []string{"", "plain", "it's", `a\b`, `\`, `'`, `\'`, `ends in \`, `x\'; SELECT 1; --`, `''\\''`, "ünïcødé ☃", "two\nlines"}
	for _, scs := range []string{"on", "off"} {
		if _, err := conn.Exec(t.Context(), "SET standard_conforming_strings = "+scs+"; SET escape_string_warning = off"); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			res, err := conn.PgConn().Exec(t.Context(), "SELECT "+sqlquote.Literal(v)+"::text").ReadAll()
			if err != nil {
				t.Errorf("standard_conforming_strings %s: %q: %v", scs, v, err)
				continue
			}
			if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != v {
				t.Errorf("standard_conforming_strings %s: %q read back as %v", scs, v, res)
			}
		}
	}
	for _, v := range []string{"", "plain", "$$", "$body$", "x$body", "$body$$body1$", "body$"} {
		res, err := conn.PgConn().Exec(t.Context(), "SELECT "+sqlquote.Dollar(v)+"::text").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != v {
			t.Errorf("Dollar(%q) = %s read back as %v, %v", v, sqlquote.Dollar(v), res, err)
		}
	}
}
