// Command walrelay relays transactional outbox rows from PostgreSQL's WAL to
// Kafka: it reads outbox inserts through a logical replication slot
// (pgoutput), publishes each as a Kafka record keyed by its aggregate id, and
// confirms a WAL position to the slot only after Kafka acknowledged every
// event before it.
//
// Subcommands: run, migrate, demo, check, config, status, slot, lsn, publication,
// replay, reconcile, dlq, prune, poll, debezium, version. This package
// parses the configuration, runs the relay (package relay; or with source
// poll, package poll) with its metrics and admin listener, and runs the
// operator commands; the pipelines themselves are those packages'.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/walrelay/walrelay/config"
)

// version, commit and buildDate are set at build time with -ldflags
// "-X main.version=… -X main.commit=… -X main.buildDate=…" (make release,
// the Dockerfile).
var (
	version   = "dev"
	commit    = "unknown"
	buildDate = "unknown"
)

// versionLine is what walrelay version prints.
func versionLine() string {
	return fmt.Sprintf("walrelay %s (commit %s, built %s, %s %s/%s)", version, commit, buildDate, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `walrelay relays transactional outbox rows from PostgreSQL to Kafka.

Usage:
  walrelay run     [--config FILE] [--key value ...]   stream the outbox to Kafka
  walrelay migrate [--config FILE] [--key value ...]   create the outbox table, publication and slot
  walrelay migrate --poll                              source poll: the outbox table, its poll columns, indexes and insert trigger (no slot)
  walrelay migrate --inbox [--inbox-table S.T]         create the inbox table of package inbox (consumer's database)
  walrelay demo    [--count N] [--crash]               a throwaway PostgreSQL and Kafka: orders, relay, shipping, end to end
  walrelay check                                       preflight: server settings, role, table, publication, brokers
  walrelay config  [--config FILE] [--key value ...]   the effective configuration as YAML, secrets redacted, with where each value came from
  walrelay status [--ready [--standby]]                one screen from a running instance (its admin listener); --ready: exit 0 only if ready
  walrelay slot list | status [NAME] | create [NAME] | drop NAME [--yes] | resync [--yes]
  walrelay lsn show [NAME] | advance NAME (--to LSN | --to-current) [--yes]
  walrelay publication show [NAME] | create [NAME] | drop NAME [--yes]
  walrelay replay --since TIME [--until TIME] [--aggregate-type T] | --ids FILE | --all  [--yes]
  walrelay reconcile (--since TIME [--until TIME] | --ids FILE | --all) [--aggregate-type T] [--replay] [--yes]   exit 2: rows missing (not replayed)
  walrelay dlq list [--since TIME] [--reason R] | show ID | replay (--id ID ... | --reason R | --all) [--yes]
  walrelay prune --older-than DURATION [--batch N] [--yes]   source poll: SENT rows only
  walrelay poll dead [--limit N] | retry (--id ID ... | --all) [--yes]   source poll: list DEAD rows, set them back to PENDING
  walrelay debezium import FILE [--worker FILE]         a Debezium outbox connector's configuration as walrelay's YAML
  walrelay version

The operator commands take --json for one JSON document. TIME is RFC 3339
(2026-12-03T04:00:00Z) or a duration before now (2h). Commands that drop,
move or send do nothing without --yes: they say what they would do.

Every configuration key is also an environment variable (postgres.dsn is
WALRELAY_POSTGRES_DSN) and a flag (--postgres.dsn). Run 'walrelay run -h' for
the keys.
`

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

// flagMistakes are undefined flags (a usageError) and the mistakes of the
// configuration file and the environment found beside them (more),
// printed after it, so that one run names every mistake.
type flagMistakes struct {
	usageError
	more error
}

func (e flagMistakes) Unwrap() error { return e.usageError }

func (e usageError) Error() string { return e.msg }

func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(ctx, args[1:], stderr)
	case "migrate":
		err = cmdMigrate(ctx, args[1:], stdout, stderr)
	case "demo":
		err = cmdDemo(ctx, args[1:], stdout, stderr)
	case "slot":
		err = cmdSlot(ctx, args[1:], stdout, stderr)
	case "lsn":
		err = cmdLSN(ctx, args[1:], stdout, stderr)
	case "publication":
		err = cmdPublication(ctx, args[1:], stdout, stderr)
	case "check":
		err = cmdCheck(ctx, args[1:], stdout, stderr)
	case "config":
		err = cmdConfig(args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(ctx, args[1:], stdout, stderr)
	case "replay":
		err = cmdReplay(ctx, args[1:], stdout, stderr)
	case "reconcile":
		err = cmdReconcile(ctx, args[1:], stdout, stderr)
	case "dlq":
		err = cmdDLQ(ctx, args[1:], stdout, stderr)
	case "prune":
		err = cmdPrune(ctx, args[1:], stdout, stderr)
	case "debezium":
		err = cmdDebezium(ctx, args[1:], stdout, stderr)
	case "poll":
		err = cmdPoll(ctx, args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, versionLine())
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		err = usageError{fmt.Sprintf("unknown command %q", args[0])}
	}
	var ue usageError
	var code exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "walrelay: %v; walrelay help lists the commands, walrelay COMMAND -h a command's flags\n", err)
		if fm := (flagMistakes{}); errors.As(err, &fm) && fm.more != nil {
			fmt.Fprintf(stderr, "walrelay: also %v\n", fm.more)
		}
		return 2
	default:
		fmt.Fprintf(stderr, "walrelay: %v\n", err)
		return 1
	}
}

// parseFlags parses a subcommand's flags; a bad flag is a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err == nil && len(pos) > 0 {
		err = usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	return err
}

// parseArgs parses flags and the positional arguments among them, which
// it returns. A mistake is one line naming the likely flag, not the flag
// package's list of every flag; -h prints that list. Every undefined flag
// is named in that line, each with its likely flag, so that one run shows
// them all.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos, undefined []string
	out := fs.Output()
	fs.SetOutput(io.Discard) // the flag package's own report of a mistake
	defer fs.SetOutput(out)
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(out)
				printUsage(out, fs)
				return nil, err
			}
			_, name, ok := strings.Cut(err.Error(), "flag provided but not defined: ")
			if !ok {
				return nil, usageError{fs.Name() + ": " + err.Error() + flagHint(fs, err)}
			}
			undefined = append(undefined, name+flagHint(fs, err))
			// Go on after it, and after its value: the next argument,
			// unless it was written --name=value or the next is a flag.
			rest := fs.Args()
			if bad := args[len(args)-len(rest)-1]; !strings.Contains(bad, "=") && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
				rest = rest[1:]
			}
			args = rest
			continue
		}
		args = fs.Args()
		if len(args) > 0 {
			pos, args = append(pos, args[0]), args[1:]
		}
	}
	if len(undefined) == 0 {
		return pos, nil
	}
	fm := flagMistakes{usageError: usageError{fs.Name() + ": flags provided but not defined: " + strings.Join(undefined, ", ")}}
	if len(undefined) == 1 {
		fm.msg = fs.Name() + ": flag provided but not defined: " + undefined[0]
	}
	// The command stops here, before it loads its configuration: the
	// file's and the environment's mistakes are named now too.
	if f := fs.Lookup("config"); f != nil {
		if src, ok := f.Value.(interface{ SourceProblems() error }); ok {
			fm.more = src.SourceProblems()
		}
	}
	return nil, fm
}

// printUsage prints a command's own flags first, then, under a heading of
// their own, the configuration's keys that it also takes as flags (each
// also a key of the --config file and a WALRELAY_ variable).
func printUsage(out io.Writer, fs *flag.FlagSet) {
	isKey := func(string) bool { return false }
	if f := fs.Lookup("config"); f != nil {
		if k, ok := f.Value.(interface{ IsKey(name string) bool }); ok {
			isKey = k.IsKey
		}
	}
	own, keys := flag.NewFlagSet(fs.Name(), flag.ContinueOnError), flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		to := own
		if isKey(f.Name) {
			to = keys
		}
		to.Var(f.Value, f.Name, f.Usage)
		to.Lookup(f.Name).DefValue = f.DefValue
	})
	own.SetOutput(out)
	keys.SetOutput(out)
	fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
	own.PrintDefaults()
	n := 0
	keys.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintf(out, "\nConfiguration keys (%d), each also a key of the --config file and a WALRELAY_ variable (docs/configuration.md):\n", n)
		keys.PrintDefaults()
	}
}

// flagHint names the defined flag an undefined one is likely a misspelling
// of.
func flagHint(fs *flag.FlagSet, err error) string {
	_, name, ok := strings.Cut(err.Error(), "flag provided but not defined: -")
	if !ok {
		return ""
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if best := config.Suggest(strings.TrimLeft(name, "-"), names); best != "" {
		return " (did you mean --" + best + "?)"
	}
	return ""
}
