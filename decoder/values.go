package decoder

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cockroachdb/apd/v3"
)

// Type OIDs from PostgreSQL's pg_type.dat; these are fixed across versions.
const (
	oidBool        = 16
	oidBytea       = 17
	oidName        = 19
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidJSON        = 114
	oidBpchar      = 1042
	oidVarchar     = 1043
	oidTimestamptz = 1184
	oidTimestamp   = 1114
	oidDate        = 1082
	oidNumeric     = 1700
	oidUUID        = 2950
	oidJSONB       = 3802
)

// Infinity is the Go value of an infinite timestamptz: it has no time.Time.
type Infinity struct{ Negative bool }

// ParseText parses a column value in PostgreSQL's text output format (as a
// replication session with DateStyle=ISO, TimeZone=UTC sends it) into a Go
// value:
//
//	bool                                bool
//	int2, int4, int8                    int64
//	numeric                             *apd.Decimal, exactly (NaN and ±Infinity too)
//	timestamptz                         time.Time in UTC, or Infinity
//	bytea                               []byte, decoded from the hex form
//	uuid                                string, checked to be one
//	json, jsonb                         []byte, as stored
//	text, varchar, char, name, others   string
func ParseText(oid uint32, b []byte) (any, error) {
	switch oid {
	case oidBool:
		switch string(b) {
		case "t":
			return true, nil
		case "f":
			return false, nil
		}
		return nil, fmt.Errorf("bool %q: want t or f", b)
	case oidInt2, oidInt4, oidInt8:
		bits := 64
		switch oid {
		case oidInt2:
			bits = 16
		case oidInt4:
			bits = 32
		}
		n, err := strconv.ParseInt(string(b), 10, bits)
		if err != nil {
			return nil, fmt.Errorf("int%d: %w", bits/8, err)
		}
		return n, nil
	case oidNumeric:
		d, _, err := apd.NewFromString(string(b))
		if err != nil {
			return nil, fmt.Errorf("numeric %q: %w", b, err)
		}
		return d, nil
	case oidTimestamptz:
		return parseTimestamptz(b)
	case oidBytea:
		return parseBytea(b)
	case oidUUID:
		if !isUUID(b) {
			return nil, fmt.Errorf("uuid %q: malformed", b)
		}
		return string(b), nil
	case oidJSON, oidJSONB:
		return b, nil
	default:
		return string(b), nil
	}
}

// Format renders a value from ParseText as header bytes: integers and
// numerics in decimal, bools as true/false, timestamps in RFC 3339 with
// nanoseconds, infinite ones as infinity/-infinity, bytes as they are.
func Format(v any) []byte {
	switch v := v.(type) {
	case bool:
		return strconv.AppendBool(nil, v)
	case int64:
		return strconv.AppendInt(nil, v, 10)
	case *apd.Decimal:
		return []byte(v.String())
	case time.Time:
		return v.AppendFormat(nil, time.RFC3339Nano)
	case Infinity:
		if v.Negative {
			return []byte("-infinity")
		}
		return []byte("infinity")
	case []byte:
		return v
	case string:
		return []byte(v)
	default:
		return fmt.Appendf(nil, "%v", v)
	}
}

// Layouts of timestamptz in DateStyle=ISO: the zone is ±hh, ±hh:mm or
// ±hh:mm:ss, the fraction up to microseconds.
var timestamptzLayouts = []string{
	"2006-01-02 15:04:05.999999999-07",
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999-07:00:00",
}

func parseTimestamptz(b []byte) (any, error) {
	s := string(b)
	switch s {
	case "infinity":
		return Infinity{}, nil
	case "-infinity":
		return Infinity{Negative: true}, nil
	}
	for _, l := range timestamptzLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return nil, fmt.Errorf("timestamptz %q: not in ISO form with a zone (is the session's DateStyle ISO?)", s)
}

// parseTime parses a timestamp, timestamptz or date (DateStyle=ISO) for a
// record's timestamp: a timestamp without zone and a date are taken as UTC.
// ±infinity gives the zero time (no timestamp of the row's own).
func parseTime(oid uint32, b []byte) (time.Time, error) {
	if s := string(b); s == "infinity" || s == "-infinity" {
		return time.Time{}, nil
	}
	switch oid {
	case oidTimestamptz:
		v, err := parseTimestamptz(b)
		if err != nil {
			return time.Time{}, err
		}
		return v.(time.Time), nil
	case oidDate:
		t, err := time.Parse(time.DateOnly, string(b))
		if err != nil {
			return time.Time{}, fmt.Errorf("date %q: not in ISO form", b)
		}
		return t, nil
	}
	t, err := time.Parse("2006-01-02 15:04:05.999999999", string(b))
	if err != nil {
		return time.Time{}, fmt.Errorf("timestamp %q: not in ISO form (is the session's DateStyle ISO?)", b)
	}
	return t, nil
}

func parseBytea(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, errors.New("bytea not in hex form (bytea_output = hex)")
	}
	out := make([]byte, hex.DecodedLen(len(b)-2))
	if _, err := hex.Decode(out, b[2:]); err != nil {
		return nil, fmt.Errorf("bytea: %w", err)
	}
	return out, nil
}

func isUUID(b []byte) bool {
	if len(b) != 36 || b[8] != '-' || b[13] != '-' || b[18] != '-' || b[23] != '-' {
		return false
	}
	for _, part := range [5][]byte{b[:8], b[9:13], b[14:18], b[19:23], b[24:]} {
		for _, c := range part {
			if !isHex[c] {
				return false
			}
		}
	}
	return true
}

// isHex tells the hexadecimal digits, either case.
var isHex = func() (t [256]bool) {
	for _, c := range []byte("0123456789abcdefABCDEF") {
		t[c] = true
	}
	return t
}()
