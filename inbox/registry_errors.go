package inbox

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
)

// Errors of decoding, on which the consumer branches when a handler
// returns them (wrapped or not).
var (
	// ErrUndecodable is a key or value that will not decode however often
	// it is tried: not framed (ErrNotFramed), a schema id the registry
	// does not have (registry.ErrSchemaUnknown), a schema that does not
	// compile or whose references the registry lacks, message indexes
	// that name no message of the schema, bytes that do not decode with
	// the schema or into the handler's type, a JSON value invalid in its
	// schema (RegistryConfig.ValidateJSON). A handler returning it has
	// the record dead-lettered at once, reason "undecodable", without
	// the retries of MaxAttempts.
	ErrUndecodable = errors.New("undecodable")
	// ErrRegistryUnavailable is a registry that did not answer (refused,
	// timed out), failed (5xx, another unexpected answer) or refused the
	// consumer's credentials (401, 403) when it was asked for a schema
	// not cached yet. A handler returning it has the record retried
	// without limit, as when the database is down, and not counted as an
	// attempt: nothing is dead-lettered because of an outage.
	ErrRegistryUnavailable = errors.New("the schema registry is unavailable")
	// ErrRegistryRefused is an ErrRegistryUnavailable of a registry that
	// refused the consumer's credentials (HTTP 401) or the schema to them
	// (403): held as an outage is (nothing dead-lettered), but a
	// configuration to mend (RegistryConfig.Username, Password), logged
	// so and counted apart (walrelay_inbox_registry_waits_total{reason=
	// "credentials"}).
	ErrRegistryRefused = errors.New("the schema registry refused the consumer's credentials")
)

// registryDown is err, of the registry, as ErrRegistryUnavailable (and
// ErrRegistryRefused for a 401 or 403).
func registryDown(err error) error {
	var re *sr.ResponseError
	if errors.Is(err, registry.ErrUnauthorized) || errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden) {
		return fmt.Errorf("%w: %w: %w", ErrRegistryUnavailable, ErrRegistryRefused, err)
	}
	return fmt.Errorf("%w: %w", ErrRegistryUnavailable, err)
}

// ErrNotFramed is a key or value that is not in Confluent's wire format
// (the magic byte 0 and a 4-byte schema id): not written by a schema
// registry format. Decode's error is also ErrUndecodable.
var ErrNotFramed = format.ErrUnframed

// undecodableError is a decoding failure that retrying cannot fix:
// errors.Is(err, ErrUndecodable), and its cause.
type undecodableError struct {
	id  uint32 // 0: not framed
	err error
}

func (e *undecodableError) Error() string {
	prefix := fmt.Sprintf("schema id %d: ", e.id)
	if msg := e.err.Error(); (e.id == 0 && errors.Is(e.err, ErrNotFramed)) || strings.HasPrefix(msg, prefix) {
		return msg
	}
	return prefix + e.err.Error()
}
func (e *undecodableError) Unwrap() error        { return e.err }
func (e *undecodableError) Is(target error) bool { return target == ErrUndecodable }

// undecodable is err, a failure of the value of schema id, as
// ErrUndecodable.
func undecodable(id uint32, err error) error { return &undecodableError{id, err} }
