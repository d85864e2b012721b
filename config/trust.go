package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/walrelay/walrelay/sink/record"
)

// TrustCheck is one setting whose trust walrelay judges: walrelay check
// prints each as a line, walrelay run logs those not OK as warnings.
type TrustCheck struct {
	// Name is the check's name in walrelay check: "postgres tls",
	// "kafka tls", "topic routing" or "admin listener".
	Name string
	// OK is false when the setting trusts the network or the rows more
	// than it should.
	OK bool
	// Detail says what was found and, when not OK, what to set. It never
	// holds a secret or the DSN, only host names and key names.
	Detail string
}

// TrustChecks judges the settings that decide whom walrelay trusts: the
// TLS of the PostgreSQL connection (anything but sslmode=verify-full to a
// host that is not local lets a man in the middle read or change the
// stream, and read a password sent in clear), SASL PLAIN without TLS to
// Kafka (the password in clear on the wire), a topic route that lets a
// row choose the start of its topic without kafka.allowed_topics, and Go's
// profiles served beyond loopback.
func (c *Config) TrustChecks() []TrustCheck {
	var out []TrustCheck
	if pc := postgresTLS(c.Postgres.DSN); pc != nil {
		out = append(out, *pc)
	}
	if kc := kafkaTLS(c); kc != nil {
		out = append(out, *kc)
	}
	out = append(out, c.routingCheck())
	if ac := c.adminCheck(); ac != nil {
		out = append(out, *ac)
	}
	return out
}

// adminCheck judges Go's profiles on an admin listener that is not on
// loopback: the listener has no authentication, and a profile shows the
// process's memory and code paths to whoever reaches the port. nil
// without admin.pprof.
func (c *Config) adminCheck() *TrustCheck {
	if !c.Admin.Pprof || c.Admin.Listen == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(c.Admin.Listen)
	if err == nil && host != "" && isLocal(host) {
		return &TrustCheck{Name: "admin listener", OK: true, Detail: "profiles (admin.pprof) on loopback only"}
	}
	return &TrustCheck{Name: "admin listener", Detail: fmt.Sprintf("admin.pprof serves Go's profiles without authentication on %s, beyond loopback: turn it off when done, or keep the port private (a NetworkPolicy, a firewall)", c.Admin.Listen)}
}

// isLocal reports whether host is a unix socket directory or a loopback
// address or name: there no one stands between walrelay and the server.
func isLocal(host string) bool {
	if strings.HasPrefix(host, "/") || strings.HasPrefix(host, "@") { // @: Linux's abstract socket namespace
		return true
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// postgresTLS judges the DSN's TLS settings as pgconn reads them (the DSN,
// then PGSSLMODE and the other variables): for each host, the first
// attempt and its fallbacks. nil if the DSN does not parse (connecting
// says why).
func postgresTLS(dsn string) *TrustCheck {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil
	}
	type attempt struct {
		host string
		tls  *tls.Config
	}
	attempts := []attempt{{pc.Host, pc.TLSConfig}}
	for _, f := range pc.Fallbacks {
		attempts = append(attempts, attempt{f.Host, f.TLSConfig})
	}
	var plain, unverified, noHostname []string // hosts by what their attempts allow, worst first
	for _, a := range attempts {
		switch {
		case isLocal(a.host):
		case a.tls == nil:
			plain = append(plain, a.host)
		case a.tls.InsecureSkipVerify && a.tls.VerifyPeerCertificate != nil:
			noHostname = append(noHostname, a.host)
		case a.tls.InsecureSkipVerify:
			unverified = append(unverified, a.host)
		}
	}
	hosts := func(hs []string) string {
		slices.Sort(hs)
		return strings.Join(slices.Compact(hs), ", ")
	}
	const fix = "set sslmode=verify-full and sslrootcert=<the PEM file of the CA that signs the server's certificate> in postgres.dsn (see docs/production.md)"
	switch {
	case len(plain) > 0:
		return &TrustCheck{Name: "postgres tls", Detail: fmt.Sprintf("%s: the connection may go without TLS (sslmode disable, allow or prefer; prefer is the default), and the server's certificate is not verified: anyone on the path can read the password and the events, or change them; %s", hosts(plain), fix)}
	case len(unverified) > 0:
		return &TrustCheck{Name: "postgres tls", Detail: fmt.Sprintf("%s: TLS without verifying the server's certificate (sslmode=require): anyone on the path can pose as the server; %s", hosts(unverified), fix)}
	case len(noHostname) > 0:
		return &TrustCheck{Name: "postgres tls", Detail: fmt.Sprintf("%s: the certificate's CA is verified, not that it names the host (sslmode=verify-ca): any server with a certificate of that CA can pose as this one; %s", hosts(noHostname), fix)}
	}
	var remote []string
	for _, a := range attempts {
		if !isLocal(a.host) {
			remote = append(remote, a.host)
		}
	}
	if len(remote) == 0 {
		return &TrustCheck{Name: "postgres tls", OK: true, Detail: "local connection (unix socket or loopback)"}
	}
	return &TrustCheck{Name: "postgres tls", OK: true, Detail: hosts(remote) + ": TLS, the certificate verified against the host name (sslmode=verify-full)"}
}

// kafkaTLS judges SASL PLAIN without TLS: PLAIN sends the password as it
// is, so without TLS anyone on the path reads it. SCRAM proves the password
// without sending it, so SCRAM without TLS is not warned of (the records
// travel in clear all the same, as with no SASL at all). nil when there is
// nothing to say: no SASL and no TLS.
func kafkaTLS(c *Config) *TrustCheck {
	t := c.Kafka.TLS
	tlsOn := t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
	mech := strings.ToUpper(c.Kafka.SASL.Mechanism)
	switch {
	case tlsOn:
		return &TrustCheck{Name: "kafka tls", OK: true, Detail: "TLS, the brokers' certificates verified"}
	case mech == "":
		return nil
	case mech != "PLAIN":
		return &TrustCheck{Name: "kafka tls", OK: true, Detail: fmt.Sprintf("no TLS: %s does not send the password, but the records travel in clear; kafka.tls.enabled encrypts them", mech)}
	}
	var remote []string
	for _, b := range c.Kafka.Brokers {
		host, _, err := net.SplitHostPort(b)
		if err != nil {
			host = b
		}
		if !isLocal(host) {
			remote = append(remote, b)
		}
	}
	if len(remote) == 0 {
		return &TrustCheck{Name: "kafka tls", OK: true, Detail: "SASL PLAIN without TLS, to loopback brokers only"}
	}
	return &TrustCheck{Name: "kafka tls", Detail: fmt.Sprintf("kafka.sasl.mechanism PLAIN without TLS sends the password in clear to %s: set kafka.tls.enabled (and kafka.tls.ca_file), or use SCRAM-SHA-512", strings.Join(remote, ", "))}
}

// routingCheck judges whether the routes confine the topics a row can
// choose: without kafka.allowed_topics, a regex route or a template that
// starts with a placeholder lets a row pick any topic but walrelay's own.
func (c *Config) routingCheck() TrustCheck {
	if len(c.Kafka.AllowedTopics) > 0 {
		return TrustCheck{Name: "topic routing", OK: true, Detail: "events may go to " + strings.Join(c.Kafka.AllowedTopics, ", ") + " only (kafka.allowed_topics)"}
	}
	var open []string
	if !record.RouteConfined(c.Kafka.Topic, c.Kafka.TopicRegex) {
		open = append(open, routeName("kafka", c.Kafka.Topic, c.Kafka.TopicRegex))
	}
	for _, t := range c.Outbox.Tables {
		if t.Topic != "" && !record.RouteConfined(t.Topic, t.TopicRegex) {
			open = append(open, routeName("outbox.tables "+t.Table, t.Topic, t.TopicRegex))
		}
	}
	if len(open) > 0 {
		return TrustCheck{Name: "topic routing", Detail: strings.Join(open, "; ") + ": a row can send its event to any topic but walrelay's own (another application's included); list the topics events may go to in kafka.allowed_topics (names, or prefixes ending in *)"}
	}
	return TrustCheck{Name: "topic routing", OK: true, Detail: "every route keeps its topics under the prefix of its template"}
}

// routeName says how a route lets the row choose its topic.
func routeName(where, topic, regex string) string {
	if regex != "" {
		return fmt.Sprintf("%s topic_regex %q sends a value it does not match to the topic of that name", where, regex)
	}
	return fmt.Sprintf("%s topic %q starts with a placeholder", where, topic)
}
