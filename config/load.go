package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
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

// IsKey reports whether the flag name is a configuration key's, so that a
// command's help can list its own flags apart from the keys.
func (f *fileFlag) IsKey(name string) bool { _, ok := f.cs.byKey[name]; return ok }

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
