package pgdsn_test

import (
	"strings"
	"testing"

	"github.com/walrelay/walrelay/relay"
	"github.com/walrelay/walrelay/replication"
)

// TestLibraryParseErrors: relay.New and replication.ReplicationConfig, the
// entry points of an embedder, refuse a DSN that does not parse without
// quoting any part of it (pgconn's own message quotes it whole when the
// URL parser fails).
func TestLibraryParseErrors(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:Sup3r Secr3t@db/shop",
		"postgres://app:Sup3r#Secr3t@db/shop",
		"postgres://app:Sup3r/Secr3t@db/shop",
		"host=db user=app password='Sup3r Secr3t",
	} {
		_, rerr := relay.New(relay.Config{ConnString: dsn})
		_, perr := replication.ReplicationConfig(dsn)
		for _, err := range []error{rerr, perr} {
			if err == nil || !strings.Contains(err.Error(), "unparseable DSN") || strings.Contains(err.Error(), "Sup3r") || strings.Contains(err.Error(), "Secr3t") {
				t.Errorf("%q: %v, want unparseable DSN without the password", dsn, err)
			}
		}
	}
}
