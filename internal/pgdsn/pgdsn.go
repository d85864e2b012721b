package pgdsn

import (
	"crypto/tls"
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Show returns the connection that dsn describes, as pgconn parses it,
// rebuilt in keyword/value form without its secrets: the hosts and ports,
// user, database, the sslmode in effect, connect_timeout and the run-time
// parameters (the values of shownParams only, the others' names with
// "redacted"); never the password, sslpassword, passfile or key files. A
// dsn that does not parse, or that Check refuses, is not shown: the result
// is "unparseable DSN" and the reason, without the DSN or any part of it
// (ParseError). Nothing is removed by pattern: what is shown is what
// parsing found.
func Show(dsn string) string {
	if dsn == "" {
		return ""
	}
	c, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return ParseError(err).Error()
	}
	if err := checkParsed(dsn, c); err != nil {
		return err.Error()
	}
	return showConn(c)
}

// encode is the advice of an error about a URL that parses otherwise than
// its writer meant.
const encode = "percent-encode @ # / ? % : and spaces in the user and password"

// Check refuses a dsn that does not parse (ParseError) and one that parses
// only as a mangled password would: a URL with an @ after its host part
// (the password held an unencoded / or ?, and what follows it became the
// port, the database name or a run-time parameter), or run-time parameters
// whose names are no setting names. The error is "unparseable DSN" and the
// reason, without any part of dsn. An empty dsn passes.
func Check(dsn string) error {
	if dsn == "" {
		return nil
	}
	c, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return ParseError(err)
	}
	return checkParsed(dsn, c)
}

// settingName is the shape of a PostgreSQL setting's name, custom
// (dotted) ones included.
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$`)

// checkParsed is Check of dsn, parsed as c.
func checkParsed(dsn string, c *pgconn.Config) error {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		rest, ok := strings.CutPrefix(dsn, scheme)
		if !ok {
			continue
		}
		if i := strings.IndexAny(rest, "/?#"); i >= 0 && strings.Contains(rest[i:], "@") {
			return errors.New("unparseable DSN: an @ after the host (" + encode + "; an @ in the database name or a parameter as %40)")
		}
	}
	for k := range c.RuntimeParams {
		if !settingName.MatchString(k) {
			return errors.New("unparseable DSN: a run-time parameter whose name is no setting name (" + encode + ")")
		}
	}
	return nil
}

// shownParams are the run-time parameters whose values Show prints: well
// known and harmless. Others (options, or a keyword pgconn does not know,
// such as libpq's oauth_client_secret or a misspelt password) may hold a
// secret: their names only.
var shownParams = map[string]bool{"application_name": true, "search_path": true, "timezone": true, "datestyle": true, "client_encoding": true}

// ParseError returns err (pgconn's failure to parse a connection string) as
// "unparseable DSN: " and pgconn's reason, with the connection string and
// every part of it left out: pgconn's own message quotes the DSN (with
// the password masked by pattern, which misses a password with a space,
// an @ or a #) and its URL parser's error quotes it whole. An error that
// is not pgconn's ParseConfigError gives "unparseable DSN" alone.
func ParseError(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return errors.New("unparseable DSN")
	}
	// pgconn's message is "cannot parse `DSN`: what (why)": with the DSN
	// emptied, what remains is pgconn's words and its cause's.
	bare := *pe
	bare.ConnString = ""
	msg := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	if cause := errors.Unwrap(pe); cause != nil {
		msg = strings.TrimSuffix(msg, " ("+cause.Error()+")") + " (" + parseCause(cause) + ")"
	}
	return errors.New("unparseable DSN: " + msg)
}

// parseCause describes the cause of a ParseConfigError without the parts
// of the DSN it quotes.
func parseCause(cause error) string {
	var ue *url.Error
	var ne *strconv.NumError
	var esc url.EscapeError
	var host url.InvalidHostError
	switch {
	case errors.As(cause, &esc):
		return "an invalid %-escape: " + encode
	case errors.As(cause, &host):
		return "an invalid character in the host: " + encode
	case errors.As(cause, &ue):
		switch s := ue.Err.Error(); {
		case s == "net/url: invalid userinfo":
			return "invalid characters in the user or password: " + encode
		case strings.HasPrefix(s, "invalid port "):
			return "an invalid port after the host: " + encode
		default:
			return "not a URL: " + encode
		}
	case errors.As(cause, &ne):
		return ne.Err.Error() // the number itself left out
	case strings.HasPrefix(cause.Error(), "failed to split host:port"):
		return "a host that does not split into host:port"
	}
	// The keyword/value parser's, the TLS set-up's and the service file's
	// causes are pgconn's fixed words, file paths and the x509 package's.
	return cause.Error()
}

// showConn renders c as a keyword/value connection string without secrets.
func showConn(c *pgconn.Config) string {
	type hostPort struct {
		host string
		port uint16
	}
	var order []hostPort
	tlsOf := map[hostPort][]*tls.Config{}
	add := func(host string, port uint16, tc *tls.Config) {
		hp := hostPort{host, port}
		if _, ok := tlsOf[hp]; !ok {
			order = append(order, hp)
		}
		tlsOf[hp] = append(tlsOf[hp], tc)
	}
	add(c.Host, c.Port, c.TLSConfig)
	for _, f := range c.Fallbacks {
		add(f.Host, f.Port, f.TLSConfig)
	}
	hosts, ports := make([]string, len(order)), make([]string, len(order))
	for i, hp := range order {
		hosts[i], ports[i] = hp.host, strconv.Itoa(int(hp.port))
	}
	kv := [][2]string{
		{"host", strings.Join(hosts, ",")}, {"port", strings.Join(ports, ",")},
		{"user", c.User}, {"dbname", c.Database}, {"sslmode", sslMode(tlsOf[order[0]])},
	}
	if c.ConnectTimeout > 0 {
		kv = append(kv, [2]string{"connect_timeout", strconv.Itoa(int(c.ConnectTimeout.Seconds()))})
	}
	params := make([]string, 0, len(c.RuntimeParams))
	for k := range c.RuntimeParams {
		params = append(params, k)
	}
	slices.Sort(params)
	for _, k := range params {
		v := c.RuntimeParams[k]
		if !shownParams[strings.ToLower(k)] {
			v = "redacted"
		}
		kv = append(kv, [2]string{k, v})
	}
	var b strings.Builder
	for i, p := range kv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p[0] + "=" + quoteDSNValue(p[1]))
	}
	return b.String()
}

// sslMode names the sslmode whose TLS attempts pgconn made of one host's
// (in order: the first, then its fallbacks): libpq's name for what is in
// effect, so that require with sslrootcert shows as verify-ca.
func sslMode(attempts []*tls.Config) string {
	switch {
	case len(attempts) == 2 && attempts[0] == nil:
		return "allow"
	case len(attempts) == 2:
		return "prefer"
	case attempts[0] == nil:
		return "disable"
	case !attempts[0].InsecureSkipVerify:
		return "verify-full"
	case attempts[0].VerifyPeerCertificate != nil:
		return "verify-ca"
	default:
		return "require"
	}
}

// quoteDSNValue quotes v for a keyword/value connection string as libpq
// reads it: in single quotes, with \ and ' escaped, when it is empty or
// holds a space, a quote or a backslash.
func quoteDSNValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\\'") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// Password returns the password that pgconn's parser finds for dsn:
// written in it, or from PGPASSWORD, a service file or a passfile.
func Password(dsn string) string {
	if dsn == "" {
		return ""
	}
	c, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	return c.Password
}
