package replication

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/internal/pgdsn"
)

// ReplicationConfig parses connString for a replication=database session
// with the pinned session settings of the package documentation.
func ReplicationConfig(connString string) (*pgconn.Config, error) {
	c, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("parse postgres dsn: %w", pgdsn.ParseError(err)) // pgconn's own text quotes the DSN
	}
	if err := pgdsn.Check(connString); err != nil {
		return nil, fmt.Errorf("parse postgres dsn: %w", err)
	}
	return replicationSession(c), nil
}

// replicationSession sets c up for a replication=database session with the
// pinned session settings, and returns it.
func replicationSession(c *pgconn.Config) *pgconn.Config {
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	for k, v := range SessionParams {
		c.RuntimeParams[k] = v
	}
	ReceiveWarnings(c.RuntimeParams)
	if c.RuntimeParams["application_name"] == "" {
		c.RuntimeParams["application_name"] = "walrelay"
	}
	c.ValidateConnect = replicationValidator(c.ValidateConnect)
	return c
}

// replicationValidator returns the check of target_session_attrs for a
// replication connection: pgconn's checks use the extended query protocol,
// which a replication connection refuses, so each is replaced by the same
// query in the simple protocol. prefer-standby has no replacement: a
// logical slot is read on the primary.
func replicationValidator(v pgconn.ValidateConnectFunc) pgconn.ValidateConnectFunc {
	if v == nil {
		return nil
	}
	check := func(query, want, what string) pgconn.ValidateConnectFunc {
		return func(ctx context.Context, conn *pgconn.PgConn) error {
			res, err := conn.Exec(ctx, query).ReadAll()
			if err != nil {
				return err
			}
			if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != want {
				return errors.New("the server is not " + what + " (target_session_attrs)")
			}
			return nil
		}
	}
	switch reflect.ValueOf(v).Pointer() {
	case reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsReadWrite).Pointer():
		return check("SHOW transaction_read_only", "off", "read-write")
	case reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsReadOnly).Pointer():
		return check("SHOW transaction_read_only", "on", "read-only")
	case reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsPrimary).Pointer():
		return check("SELECT pg_is_in_recovery()", "f", "a primary")
	case reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsStandby).Pointer():
		return check("SELECT pg_is_in_recovery()", "t", "a standby")
	}
	return v
}

// SessionParams are the settings pinned on every session, so that text
// values have one form whatever the server's defaults.
var SessionParams = map[string]string{
	"DateStyle":          "ISO",
	"TimeZone":           "UTC",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"IntervalStyle":      "postgres",
}

// ReceiveWarnings sets client_min_messages in params, the startup
// parameters of a session, to warning unless it asks for a lower level
// (notice, log, debug…): PostgreSQL 18 tells of a publication it cannot see
// as of a decoded transaction (and of that transaction's rows passed over)
// with a WARNING only, which a session at error never receives. A startup
// parameter beats the role's and the database's settings (ALTER ROLE or
// DATABASE ... SET client_min_messages) and the DSN's options (-c).
func ReceiveWarnings(params map[string]string) {
	switch strings.ToLower(strings.TrimSpace(params["client_min_messages"])) {
	case "debug5", "debug4", "debug3", "debug2", "debug1", "debug", "log", "notice", "warning":
	default:
		params["client_min_messages"] = "warning"
	}
}
