package schemafirst

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/hamba/avro/v2"

	"github.com/walrelay/walrelay/format"
)

// Avro's logical types in registered_avro: the application's JSON holds
// what it naturally holds (a decimal as a number or its text, a timestamp
// as ISO-8601 text or a number), and walrelay writes the logical type's
// underlying value, exactly: a value that the type cannot hold without
// rounding or truncating it is a mismatch. Written as their underlying
// types (int32, int64, []byte, [N]byte), which hamba/avro writes as they
// are.

// avroLogical converts v, at path, into the underlying value of the
// logical type l of schema s (a primitive or a fixed).
func avroLogical(s avro.Schema, l avro.LogicalSchema, v any, path string) (out any, field, reason string) {
	bad := func(format string, args ...any) (any, string, string) {
		return nil, path, fmt.Sprintf(format, args...)
	}
	name := branchName(s)
	switch l.Type() {
	case avro.Decimal:
		dl := l.(*avro.DecimalLogicalSchema)
		unscaled, why := decimalUnscaled(v, dl.Precision(), dl.Scale())
		if why != "" {
			return bad("%s: %s", name, why)
		}
		b := twosComplement(unscaled)
		fs, fixed := s.(*avro.FixedSchema)
		if !fixed {
			return b, "", ""
		}
		if len(b) > fs.Size() {
			return bad("%s: %s does not fit the %d bytes of the fixed %s", name, unscaled, fs.Size(), fs.FullName())
		}
		a := reflect.New(reflect.ArrayOf(fs.Size(), reflect.TypeFor[byte]())).Elem()
		fill := byte(0)
		if unscaled.Sign() < 0 {
			fill = 0xff // sign extension, as Avro's Java library pads a fixed
		}
		pad := fs.Size() - len(b)
		for i := range pad {
			a.Index(i).SetUint(uint64(fill))
		}
		reflect.Copy(a.Slice(pad, fs.Size()), reflect.ValueOf(b))
		return a.Interface(), "", ""
	case avro.UUID:
		str, ok := v.(string)
		if !ok {
			return bad("want a uuid (a string), got %s", jsonType(v))
		}
		if !uuidText.MatchString(str) {
			return bad("%q is not a uuid (8-4-4-4-12 hexadecimal digits)", clipValue(str))
		}
		return str, "", ""
	case avro.Date:
		switch x := v.(type) {
		case json.Number:
			n, ok := wholeInRange(x, math.MinInt32, math.MaxInt32)
			if !ok {
				return bad("want a date: a whole number of days since 1970-01-01 (an int), got %s", x)
			}
			return int32(n), "", ""
		case string:
			t, err := time.Parse(time.DateOnly, x)
			if err != nil {
				return bad("%q is not a date (YYYY-MM-DD)", clipValue(x))
			}
			return int32(floorDiv(t.Unix(), 86400)), "", ""
		}
		return bad("want a date (YYYY-MM-DD, or days since 1970-01-01), got %s", jsonType(v))
	case avro.TimeMillis, avro.TimeMicros:
		unit := time.Millisecond
		if l.Type() == avro.TimeMicros {
			unit = time.Microsecond
		}
		perDay := int64(24 * time.Hour / unit)
		switch x := v.(type) {
		case json.Number:
			n, ok := wholeInRange(x, 0, perDay-1)
			if !ok {
				return bad("want a %s: a whole number of %s after midnight, in range [0, %d), got %s", l.Type(), unitName(unit), perDay, x)
			}
			return timeValue(l.Type(), n), "", ""
		case string:
			t, err := time.Parse("15:04:05.999999999", x)
			if err != nil {
				return bad("%q is not a time of day (HH:MM:SS, a fraction optional)", clipValue(x))
			}
			d := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())
			if d%unit != 0 {
				return bad("%q is more precise than a %s holds (a %s)", x, l.Type(), unitName(unit)[:len(unitName(unit))-1])
			}
			return timeValue(l.Type(), int64(d/unit)), "", ""
		}
		return bad("want a %s (HH:MM:SS.fff, or a number of %s after midnight), got %s", l.Type(), unitName(unit), jsonType(v))
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		local := l.Type() == avro.LocalTimestampMillis || l.Type() == avro.LocalTimestampMicros
		unit := time.Millisecond
		if l.Type() == avro.TimestampMicros || l.Type() == avro.LocalTimestampMicros {
			unit = time.Microsecond
		}
		switch x := v.(type) {
		case json.Number:
			n, ok := wholeInRange(x, math.MinInt64, math.MaxInt64)
			if !ok {
				return bad("want a %s: a whole number of %s since 1970-01-01T00:00:00, got %s", l.Type(), unitName(unit), x)
			}
			return n, "", ""
		case string:
			text := x
			if len(text) > 10 && text[10] == ' ' { // PostgreSQL's text form
				text = text[:10] + "T" + text[11:]
			}
			var t time.Time
			withOffset, errOffset := time.Parse(time.RFC3339Nano, text)
			wall, errWall := time.Parse("2006-01-02T15:04:05.999999999", text)
			switch {
			case errOffset == nil && local:
				return bad("%q has a UTC offset: a %s is a wall-clock time, without one", clipValue(x), l.Type())
			case errOffset == nil:
				t = withOffset
			case errWall == nil && !local:
				return bad("%q has no UTC offset (Z, or +02:00): a %s is an instant (a local-timestamp-* is a wall-clock time)", clipValue(x), l.Type())
			case errWall == nil:
				t = wall
			default:
				return bad("%q is not an ISO-8601 date and time (2024-02-29T12:34:56.789%s)", clipValue(x), map[bool]string{false: "Z", true: ""}[local])
			}
			if t.Nanosecond()%int(unit) != 0 {
				return bad("%q is more precise than a %s holds (a %s)", clipValue(x), l.Type(), unitName(unit)[:len(unitName(unit))-1])
			}
			if unit == time.Millisecond {
				return t.UnixMilli(), "", ""
			}
			return t.UnixMicro(), "", ""
		}
		return bad("want a %s (an ISO-8601 date and time, or a number of %s since 1970-01-01T00:00:00), got %s", l.Type(), unitName(unit), jsonType(v))
	case avro.Duration:
		str, ok := v.(string)
		if !ok {
			return bad("want a duration (ISO-8601: P1Y2M3DT4H5M6.789S), got %s", jsonType(v))
		}
		months, days, millis, why := parseDuration(str)
		if why != "" {
			return bad("%q is not a duration that Avro holds: %s", clipValue(str), why)
		}
		var b [12]byte
		binary.LittleEndian.PutUint32(b[0:], months)
		binary.LittleEndian.PutUint32(b[4:], days)
		binary.LittleEndian.PutUint32(b[8:], millis)
		return b, "", ""
	}
	return bad("the logical type %s is not supported", l.Type())
}

// uuidText is a UUID's text: 8-4-4-4-12 hexadecimal digits.
var uuidText = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// clipValue shortens a value quoted in a reason.
func clipValue(s string) string {
	if len(s) > 64 {
		return clip(s)[:64] + "…"
	}
	return s
}

func unitName(u time.Duration) string {
	if u == time.Millisecond {
		return "milliseconds"
	}
	return "microseconds"
}

// timeValue is a time of day's underlying value: time-millis an int32;
// time-micros a time.Duration, which hamba/avro writes as a long of
// microseconds (it takes every int64 for a Duration there).
func timeValue(t avro.LogicalType, n int64) any {
	if t == avro.TimeMillis {
		return int32(n)
	}
	return time.Duration(n) * time.Microsecond
}

// wholeInRange reads n as a whole number in [lo, hi].
func wholeInRange(n json.Number, lo, hi int64) (int64, bool) {
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i < lo || i > hi {
		return 0, false
	}
	return i, true
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// maxDecimalText bounds the text of a decimal that decimalUnscaled reads:
// twice MaxAvroDecimalPrecision's digits (a precision's, and as many zeros
// again written after the point or before an exponent), and some more for
// a sign, a point and an exponent.
const maxDecimalText = 2*format.MaxAvroDecimalPrecision + 32

// decimalUnscaled reads v (a JSON number, or a string holding one) as a
// decimal of precision and scale: its unscaled value (the value times
// 10^scale), exact, or why not.
func decimalUnscaled(v any, precision, scale int) (*big.Int, string) {
	var text string
	switch x := v.(type) {
	case json.Number:
		text = string(x)
	case string:
		text = x
	default:
		return nil, fmt.Sprintf("want a decimal (a number, or a string holding one), got %s", jsonType(v))
	}
	// Bounded before apd and math/big read it (their cost grows faster
	// than the text, and with 10^shift): the schema's precision and scale
	// (ParseAvro's bound; checked again for a schema parsed otherwise),
	// and the text, which needs no more than the precision's and the
	// scale's digits, a sign, a point and an exponent, and some zeros.
	if precision > format.MaxAvroDecimalPrecision || scale > format.MaxAvroDecimalPrecision || scale < 0 {
		return nil, fmt.Sprintf("a decimal of precision %d and scale %d, beyond %d", precision, scale, format.MaxAvroDecimalPrecision)
	}
	if len(text) > maxDecimalText {
		return nil, fmt.Sprintf("a decimal written in %d characters, more than the %d that any decimal of a precision up to %d needs", len(text), maxDecimalText, format.MaxAvroDecimalPrecision)
	}
	d, _, err := apd.NewFromString(strings.TrimSpace(text))
	if err != nil || d.Form != apd.Finite {
		return nil, fmt.Sprintf("%q is not a decimal number", clipValue(text))
	}
	coeff := d.Coeff.MathBigInt()
	digits := len(coeff.String())
	if coeff.Sign() == 0 {
		return new(big.Int), ""
	}
	shift := int(d.Exponent) + scale
	switch {
	case shift > precision:
		return nil, fmt.Sprintf("%s has more digits than the precision %d (scale %d) holds", clipValue(text), precision, scale)
	case shift < -digits:
		return nil, fmt.Sprintf("%s has more digits after the point than the scale %d holds", clipValue(text), scale)
	}
	n := new(big.Int).Set(coeff)
	if shift >= 0 {
		n.Mul(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(shift)), nil))
	} else {
		var rem big.Int
		n.QuoRem(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-shift)), nil), &rem)
		if rem.Sign() != 0 {
			return nil, fmt.Sprintf("%s has more digits after the point than the scale %d holds", clipValue(text), scale)
		}
	}
	if nd := len(n.String()); nd > precision {
		return nil, fmt.Sprintf("%s has %d digits at scale %d, more than the precision %d", clipValue(text), nd, scale, precision)
	}
	if d.Negative {
		n.Neg(n)
	}
	return n, ""
}

// twosComplement is n in big-endian two's complement, in the fewest bytes
// (Java's BigInteger.toByteArray, which Avro's decimal conversion writes).
func twosComplement(n *big.Int) []byte {
	if n.Sign() >= 0 {
		b := n.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	m := new(big.Int).Neg(n)
	m.Sub(m, big.NewInt(1)) // -n-1 >= 0: its bytes, inverted, are n's
	b := m.Bytes()
	if len(b) == 0 || b[0]&0x80 != 0 {
		b = append([]byte{0}, b...)
	}
	for i := range b {
		b[i] = ^b[i]
	}
	return b
}

// isoDuration is an ISO-8601 duration of whole years, months, weeks, days,
// hours and minutes, and seconds with up to 3 decimals.
var isoDuration = regexp.MustCompile(`^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)(?:\.(\d+))?S)?)?$`)

// parseDuration reads an ISO-8601 duration into Avro's duration: months,
// days and milliseconds, each an unsigned 32-bit number (a year is 12
// months, a week 7 days; hours, minutes and seconds are milliseconds).
func parseDuration(s string) (months, days, millis uint32, why string) {
	m := isoDuration.FindStringSubmatch(s)
	if m == nil || s == "P" || strings.HasSuffix(s, "T") {
		return 0, 0, 0, "want ISO-8601's PnYnMnWnDTnHnMnS, whole and non-negative (seconds with up to 3 decimals)"
	}
	num := func(i int) uint64 {
		if m[i] == "" {
			return 0
		}
		n, err := strconv.ParseUint(m[i], 10, 32)
		if err != nil {
			return math.MaxUint64
		}
		return n
	}
	frac := m[8]
	if len(strings.TrimRight(frac, "0")) > 3 {
		return 0, 0, 0, "more precise than a millisecond"
	}
	fracMillis := uint64(0)
	if frac != "" {
		f := (frac + "000")[:3]
		fracMillis, _ = strconv.ParseUint(f, 10, 32)
	}
	mo := num(1)*12 + num(2)
	d := num(3)*7 + num(4)
	ms := num(5)*3_600_000 + num(6)*60_000 + num(7)*1000 + fracMillis
	if num(1) > math.MaxUint32 || num(2) > math.MaxUint32 || num(3) > math.MaxUint32 || num(4) > math.MaxUint32 ||
		num(5) > math.MaxUint32 || num(6) > math.MaxUint32 || num(7) > math.MaxUint32 ||
		mo > math.MaxUint32 || d > math.MaxUint32 || ms > math.MaxUint32 {
		return 0, 0, 0, "a part beyond 32 bits (months, days or milliseconds)"
	}
	return uint32(mo), uint32(d), uint32(ms), ""
}
