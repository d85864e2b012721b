package inbox

import (
	"crypto/tls"
	"time"
)

// RegistryConfig is how a consumer reaches the schema registry of the
// records it decodes (Confluent's Schema Registry API; Apicurio serves it
// at /apis/ccompat/v7).
type RegistryConfig struct {
	// URL is the registry's base URL, http or https, without
	// credentials (they go in Username and Password).
	URL string
	// Username and Password are for HTTP basic auth; none when Username is
	// empty.
	Username, Password string
	// Timeout bounds one request; default 10 s.
	Timeout time.Duration
	// TLS is the TLS configuration of an https URL; nil for Go's defaults.
	TLS *tls.Config
	// ValidateJSON validates JSON Schema values against their schema
	// before they are decoded: an invalid one is ErrUndecodable, naming
	// the field (a JSON pointer) and the reason. Off, a JSON value is
	// decoded as it is (its schema fetched by id only for its type, and
	// not compiled). walrelay's registered_jsonschema format validates
	// each value before it writes it.
	ValidateJSON bool
	// MaxSchemaBytes bounds the text of a schema the Registry compiles,
	// with the text of the schemas it references: a record of a larger
	// one is ErrUndecodable, nothing compiled. Compiling costs some 40 to
	// 80 times the text at its peak, keeping it some 10 to 16 times.
	// Default 512 KiB (registry.DefaultMaxCompiledSchemaBytes), far above
	// Debezium's schemas of wide tables. An answer of the registry is
	// read up to 8 times this (4 MiB): a larger one is an outage (the
	// record held, retried).
	MaxSchemaBytes int
	// MaxDecodedBytes bounds what one decoded Avro or Protobuf key or
	// value may cost in memory (an estimate, from a walk of its bytes
	// before it is decoded: format.DecodedBudget): beyond it, it is
	// ErrUndecodable (dead-lettered), not an out-of-memory kill of the
	// consumer, again at every restart on the same record. Default
	// format.MaxDecodedBytes (64 MiB; a record of up to 128 KiB gets half
	// of it); raise it (and the process's memory) for values of hundreds
	// of thousands of small items.
	MaxDecodedBytes int
	// UnusableReadInterval bounds the fetching of a schema id that cannot
	// be used: one the registry lacks, or whose schema does not compile,
	// references what the registry lacks or is of a type not decoded.
	// Once a fetch finds it so, the records of the id within the interval
	// are ErrUndecodable with the same cause without a request, so that
	// records framing such ids (anyone who produces to the topic chooses
	// them) cost a request and a compilation once per id every
	// UnusableReadInterval, not once each. Default 10 s.
	UnusableReadInterval time.Duration
}

// DefaultUnusableReadInterval is RegistryConfig.UnusableReadInterval's
// default.
const DefaultUnusableReadInterval = 10 * time.Second
