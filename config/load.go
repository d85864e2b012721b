package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

	"github.com/walrelay/walrelay/internal/faultinject"
	"github.com/walrelay/walrelay/internal/pgdsn"
)

// EnvName returns the environment variable of a key.
func EnvName(key string) string {
	return "WALRELAY_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Set is a Config with its keys, and the flags bound to them.
type Set struct {
	cfg   Config
	keys  []*key
	byKey map[string]*key
	file  *string
	flags map[string]*string
}

// NewSet registers --config and a flag per key on fs.
func NewSet(fs *flag.FlagSet) *Set {
	cs := &Set{byKey: map[string]*key{}, flags: map[string]*string{}}
	cs.keys = cs.cfg.keys()
	ff := &fileFlag{cs: cs}
	cs.file = &ff.path
	fs.Var(ff, "config", "YAML configuration `file`")
	for _, k := range cs.keys {
		cs.byKey[k.name] = k
		// The help without Markdown's backquotes, which the flag package
		// would take for the name of the value.
		cs.flags[k.name] = fs.String(k.name, "", strings.ReplaceAll(k.help, "`", "")+" (default "+strconv.Quote(k.show())+"; env "+EnvName(k.name)+")")
	}
	return cs
}

// fileFlag is --config: the file's path, and the set it belongs to, so
// that a caller holding only the flag set can ask for the mistakes of the
// file and the environment (SourceProblems).
type fileFlag struct {
	cs   *Set
	path string
}

func (f *fileFlag) String() string { return f.path }

func (f *fileFlag) Set(v string) error { f.path = v; return nil }

// SourceProblems reads the file (if --config names one) and the
// environment as Load does, and returns every unknown key and refused
// value in them (Problems), or nil: for a command that found undefined
// flags and does not load, so that one run names every mistake.
func (f *fileFlag) SourceProblems() error {
	var problems Problems
	if f.path != "" {
		problems.add(f.cs.LoadFile(f.path))
	}
	problems.add(f.cs.checkEnv())
	for _, k := range f.cs.keys {
		if v, ok := os.LookupEnv(EnvName(k.name)); ok {
			if err := k.set(v); err != nil {
				problems.add(fmt.Errorf("environment %s: %w", EnvName(k.name), err))
			}
		}
	}
	return problems.Err()
}

// Config returns the configuration the set fills.
func (cs *Set) Config() *Config { return &cs.cfg }

// File returns the --config file named on the command line, if any.
func (cs *Set) File() string { return *cs.file }

// Load applies the file, the environment and the flags that fs saw, in that
// order, and validates the result; kafka.brokers is required if needKafka.
func (cs *Set) Load(fs *flag.FlagSet, needKafka bool) (*Config, error) {
	// Every unknown key and every value refused, of the file, the
	// environment and the flags, is reported at once.
	var problems Problems
	if *cs.file != "" {
		problems.add(cs.LoadFile(*cs.file))
	}
	problems.add(cs.checkEnv())
	for _, k := range cs.keys {
		if v, ok := os.LookupEnv(EnvName(k.name)); ok {
			if err := k.set(v); err != nil {
				problems.add(fmt.Errorf("environment %s: %w", EnvName(k.name), err))
			}
			k.setFrom = "env"
		}
	}
	fs.Visit(func(f *flag.Flag) {
		k, ok := cs.byKey[f.Name]
		if !ok {
			return
		}
		if e := k.set(f.Value.String()); e != nil {
			problems.add(fmt.Errorf("flag --%s: %w", k.name, e))
		}
		k.setFrom = "flag"
	})
	if err := problems.Err(); err != nil {
		return nil, err
	}
	if err := cs.cfg.validate(needKafka); err != nil {
		return nil, err
	}
	// A DSN that does not parse is refused here, in pgconn's words without
	// the DSN (which they would quote), before anything can print it; so is
	// one that parses only as a mangled password would (pgdsn.Check).
	if _, err := pgconn.ParseConfig(cs.cfg.Postgres.DSN); err != nil {
		return nil, fmt.Errorf("postgres.dsn: %w", DSNError(err))
	}
	if err := pgdsn.Check(cs.cfg.Postgres.DSN); err != nil {
		return nil, fmt.Errorf("postgres.dsn: %w", err)
	}
	if k := cs.byKey["postgres.table"]; len(cs.cfg.Outbox.Tables) > 0 && k.setFrom != "default" {
		return nil, fmt.Errorf("postgres.table (from the %s) and outbox.tables are both set: list every outbox table in outbox.tables", map[string]string{"file": "config file", "env": "environment", "flag": "flags"}[k.setFrom])
	}
	return &cs.cfg, cs.cfg.readSecrets()
}

// LoadFile applies the YAML configuration file at path. Each value is
// taken as written: the text of the YAML scalar, not YAML's reading of it
// (0x1F stays 0x1F, 1.10 stays 1.10), and each key setter parses it as its
// type requires. A key given twice, in any spelling (nested or dotted), is
// refused with both lines.
func (cs *Set) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	// One document: the keys of a second one would be ignored.
	var next yaml.Node
	if err := dec.Decode(&next); err == nil && len(next.Content) > 0 && resolve(next.Content[0]).ShortTag() != "!!null" {
		return fmt.Errorf("config file %s: line %d: a second YAML document (after ---): walrelay reads one; put every key in one document", path, next.Content[0].Line)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	f := flattener{flat: map[string]string{}, structured: map[string]bool{}, line: map[string]int{}}
	if len(doc.Content) > 0 { // an empty file sets nothing
		root := resolve(doc.Content[0])
		if root.Kind != yaml.MappingNode {
			return fmt.Errorf("config file %s: the file must be a YAML mapping", path)
		}
		if err := f.mapping("", root); err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}
	names := make([]string, 0, len(f.flat))
	for n := range f.flat {
		names = append(names, n)
	}
	sort.Strings(names)
	var problems Problems
	for _, n := range names {
		k, ok := cs.byKey[n]
		if !ok {
			problems.add(fmt.Errorf("config file %s: unknown key %q%s", path, n, cs.suggest(n)))
			continue
		}
		if f.structured[n] && !k.structured {
			problems.add(fmt.Errorf("config file %s: key %s: a list of plain values is expected", path, n))
			continue
		}
		if err := k.set(f.flat[n]); err != nil {
			problems.add(fmt.Errorf("config file %s: key %s: %w", path, n, err))
			continue
		}
		k.setFrom = "file"
	}
	return problems.Err()
}

// Problems are the mistakes found in a configuration, reported together:
// each unknown key and refused value of the file, the environment and the
// flags, so that one run names them all.
type Problems []error

func (p *Problems) add(err error) {
	var more Problems
	switch {
	case err == nil:
	case errors.As(err, &more):
		*p = append(*p, more...)
	default:
		*p = append(*p, err)
	}
}

// Err is nil without problems, the one problem, or p.
func (p Problems) Err() error {
	switch len(p) {
	case 0:
		return nil
	case 1:
		return p[0]
	}
	return p
}

// Error names every problem, one a line after a count.
func (p Problems) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d mistakes in the configuration:", len(p))
	for _, e := range p {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

// Unwrap gives the problems to errors.Is and errors.As.
func (p Problems) Unwrap() []error { return p }

// checkEnv refuses a WALRELAY_ variable that names no key, as the file
// refuses an unknown key: a misspelt variable would otherwise leave its
// setting at the default unnoticed. WALRELAY_TEST_* and WALRELAY_SOAK belong
// to the test suite, faultinject.Vars to a build with crash points.
func (cs *Set) checkEnv() error {
	known := map[string]bool{}
	for _, k := range cs.keys {
		known[EnvName(k.name)] = true
	}
	for _, v := range faultinject.Vars {
		known[v] = true
	}
	var unknown []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "WALRELAY_") && !known[name] && !strings.HasPrefix(name, "WALRELAY_TEST_") && name != "WALRELAY_SOAK" {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	var problems Problems
	for _, u := range unknown {
		best, bestD := "", 4
		for n := range known {
			if d := editDistance(u, n); d < bestD || d == bestD && n < best {
				best, bestD = n, d
			}
		}
		hint := ""
		if best != "" {
			hint = " (did you mean " + best + "?)"
		}
		problems.add(fmt.Errorf("environment variable %s names no configuration key%s", u, hint))
	}
	return problems.Err()
}

// suggest names a known key that n is probably a misspelling of.
func (cs *Set) suggest(n string) string {
	names := make([]string, len(cs.keys))
	for i, k := range cs.keys {
		names[i] = k.name
	}
	if best := Suggest(n, names); best != "" {
		return " (did you mean " + best + "?)"
	}
	return ""
}

// Suggest returns the one of names that n is probably a misspelling of
// (fewer than 4 edits away, the closest), or "".
func Suggest(n string, names []string) string {
	best, bestD := "", 4
	for _, k := range names {
		if d := editDistance(n, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// flattener turns nested YAML mappings into dotted keys, from the YAML
// nodes themselves: a scalar is its text as written; a list of scalars
// the texts comma-separated; a list holding mappings its YAML text (the
// key is then marked in structured), which the key's setter decodes into
// string fields, as written too. line holds where each key was given.
type flattener struct {
	flat       map[string]string
	structured map[string]bool
	line       map[string]int
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func (f *flattener) mapping(prefix string, m *yaml.Node) error {
	here := map[string]int{} // this mapping's own keys: YAML forbids one twice
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, vn := resolve(m.Content[i]), resolve(m.Content[i+1])
		if kn.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: a key must be a plain name", kn.Line)
		}
		name := kn.Value
		if prefix != "" {
			name = prefix + "." + kn.Value
		}
		if first, ok := here[kn.Value]; ok {
			return fmt.Errorf("key %s is given twice: line %d and line %d", name, first, kn.Line)
		}
		here[kn.Value] = kn.Line
		if err := f.value(name, kn.Line, vn); err != nil {
			return err
		}
	}
	return nil
}

func (f *flattener) value(name string, line int, v *yaml.Node) error {
	if v.Kind == yaml.MappingNode {
		return f.mapping(name, v)
	}
	if first, ok := f.line[name]; ok {
		return fmt.Errorf("key %s is given twice: line %d and line %d", name, first, line)
	}
	f.line[name] = line
	switch v.Kind {
	case yaml.SequenceNode:
		if slices.ContainsFunc(v.Content, func(x *yaml.Node) bool { return resolve(x).Kind == yaml.MappingNode }) {
			b, err := yaml.Marshal(v)
			if err != nil {
				return fmt.Errorf("key %s: %w", name, err)
			}
			f.flat[name], f.structured[name] = string(b), true
			return nil
		}
		parts := make([]string, 0, len(v.Content))
		for _, x := range v.Content {
			x = resolve(x)
			if x.Kind != yaml.ScalarNode {
				return fmt.Errorf("key %s: a list of plain values is expected", name)
			}
			t, err := scalarText(name, x)
			if err != nil {
				return err
			}
			parts = append(parts, t)
		}
		f.flat[name] = strings.Join(parts, ",")
	case yaml.ScalarNode:
		t, err := scalarText(name, v)
		if err != nil {
			return err
		}
		f.flat[name] = t
	default:
		return fmt.Errorf("key %s: line %d: a value, a list or a mapping is expected", name, v.Line)
	}
	return nil
}

// scalarText is a scalar's text as written, the value of key name; nothing
// written is empty. YAML reads an unquoted ~, null, Null or NULL as its
// null, which would be empty too, silently, where the text meant may be a
// password or a prefix: refused, naming the two ways to write it.
func scalarText(name string, n *yaml.Node) (string, error) {
	if n.ShortTag() == "!!null" {
		if n.Value == "" {
			return "", nil
		}
		return "", fmt.Errorf("key %s: line %d: an unquoted %s is YAML's null, not text: write '' for an empty value, or quote it ('%s') for the text", name, n.Line, n.Value, n.Value)
	}
	return n.Value, nil
}

// YAML renders the effective configuration as a YAML file that walrelay
// reads back, secrets redacted, each value followed by where it came from:
// default, the file (--config), the environment (its variable) or a flag.
func (cs *Set) YAML() (string, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range cs.keys {
		if k.name == "postgres.table" && len(cs.cfg.Outbox.Tables) > 0 {
			continue // not in effect: outbox.tables lists the tables
		}
		m := root
		parts := strings.Split(k.name, ".")
		for _, part := range parts[:len(parts)-1] {
			m = child(m, part)
		}
		v := k.show()
		if k.redact != nil {
			v = k.redact(v)
		}
		from := k.setFrom
		switch from {
		case "file":
			from = "from " + *cs.file
		case "env":
			from = "from " + EnvName(k.name)
		case "flag":
			from = "from --" + k.name
		}
		if k.name == "postgres.dsn" && v != "" {
			from += "; as parsed, without its password, passfile and TLS files"
		}
		val := &yaml.Node{Kind: yaml.ScalarNode, Value: v, LineComment: from}
		if v == "" || strings.ContainsAny(v, ":#{}[],&*!|>'\"%@`") || strings.TrimSpace(v) != v {
			val.Style = yaml.DoubleQuotedStyle
		}
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: parts[len(parts)-1]}, val)
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}); err != nil {
		return "", fmt.Errorf("render the configuration: %w", err)
	}
	return b.String(), nil
}

// child returns the mapping under key in mapping m, adding it if missing.
func child(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	c := &yaml.Node{Kind: yaml.MappingNode}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, c)
	return c
}

// Summary is the start-up log line's part of the configuration: where
// events come from and go to, secrets redacted. walrelay config prints
// the rest.
func (cs *Set) Summary() []any {
	c := &cs.cfg
	attrs := []any{"source", c.Source}
	if c.Source == "wal" {
		attrs = append(attrs, "slot", c.Postgres.Slot, "publication", c.Postgres.Publication)
	}
	tables := c.Postgres.Table
	if len(c.Outbox.Tables) > 0 {
		names := make([]string, len(c.Outbox.Tables))
		for i, t := range c.Outbox.Tables {
			names[i] = t.Table
		}
		tables = strings.Join(names, ",")
	}
	return append(attrs, "postgres", RedactDSN(c.Postgres.DSN), "tables", tables, "kafka", strings.Join(c.Kafka.Brokers, ","),
		"topic", c.Kafka.Topic, "exactly_once", c.Kafka.ExactlyOnce, "admin", c.Admin.Listen)
}

// Effective renders the configuration for the start-up log, secrets
// redacted.
func (cs *Set) Effective() []any {
	var attrs []any
	for _, k := range cs.keys {
		v := k.show()
		if k.redact != nil {
			v = k.redact(v)
		}
		attrs = append(attrs, k.name, v)
	}
	return attrs
}
