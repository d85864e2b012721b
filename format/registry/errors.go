package registry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/internal/textcut"
)

// Errors of a registry that retrying cannot fix for that schema: the event
// goes to the dead-letter topic. ErrUnauthorized stops walrelay. Any other
// error of the registry (down, slow, 5xx) is an outage: the event is held
// and sent again.
var (
	// ErrNotRegistered is a schema, a subject or a version that the
	// registry says it does not have (HTTP 404 with Confluent's error code
	// 40401, 40402 or 40403), where walrelay registers nothing: with
	// auto-registration off, or a schema-first format (which registers
	// only the operator's schema files, at start).
	ErrNotRegistered = errors.New("the schema is not registered under its subject")
	// ErrRefused is a schema that the registry refuses (incompatible with
	// the subject's, or invalid).
	ErrRefused = errors.New("the registry refused the schema")
	// ErrUnauthorized is a registry refusing walrelay's credentials (401)
	// or the subject to them (403): the whole stream's error, which the
	// operator fixes.
	ErrUnauthorized = errors.New("the schema registry refused walrelay's credentials")
	// ErrNotSchemaRegistry is a URL that answers, but not as Confluent's
	// Schema Registry API does: a 404 without Confluent's error code (a
	// wrong path: Apicurio serves the API at /apis/ccompat/v7, its own v2
	// API is another), or an answer that is not the API's JSON. It is a
	// configuration problem, held as an outage (the events wait, nothing
	// is dead-lettered); walrelay run refuses to start on it (Ping).
	ErrNotSchemaRegistry = errors.New("the schema registry URL does not serve Confluent's Schema Registry API (a wrong path? Apicurio serves it at /apis/ccompat/v7)")
)

// ErrPayload is a payload that the format cannot write (Debezium's
// converter fails on it too), or whose schema is larger than walrelay
// sends to a registry (Config.MaxSchemaBytes): the event goes to the
// dead-letter topic. Every format of package format and its subpackages
// wraps it.
var ErrPayload = errors.New("the payload cannot be written in the format")

// ErrSchemaUnknown is a framed value whose schema id the registry does
// not have, or has in other subjects only than the value's (the
// passthrough format's strategy): the event goes to the dead-letter topic.
var ErrSchemaUnknown = errors.New("the registry has no schema of the payload's id")

// retryLater reports whether an HTTP status asks the client to retry
// later: 408 Request Timeout, 425 Too Early, 429 Too Many Requests
// (Confluent's and Apicurio's rate limit, error code 42901). Such an
// answer is an outage (held, retried), never a refusal of the schema nor
// a URL that does not serve the API.
func retryLater(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooEarly || status == http.StatusTooManyRequests
}

// NotFound reports whether re is Confluent's API saying that it does not
// have a subject (error code 40401), a version (40402) or a schema
// (40403): a 404 without one of these codes is a path the server does not
// serve (ErrNotSchemaRegistry), not an answer about the schema.
func NotFound(re *sr.ResponseError) bool {
	return re.StatusCode == http.StatusNotFound && re.ErrorCode >= 40401 && re.ErrorCode <= 40403
}

// wrongPath is the error of a 404 that is not Confluent's NotFound.
func wrongPath(what string, re *sr.ResponseError) error {
	return fmt.Errorf("%s: %w: HTTP 404 from %s without Confluent's error code (error_code %d: %s)", what, ErrNotSchemaRegistry, redacted(re.URL), re.ErrorCode, clip(re.Error()))
}

// redacted is u without a password, should the URL carry one.
func redacted(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	return "the registry's URL"
}

// conflict reports whether err is a registry's 409.
func conflict(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusConflict
}

// Classify tells a registry's refusal of one schema (a deterministic
// error for that value) from an outage (transient): err, of a request
// about subject, wrapped as ErrNotRegistered, ErrRefused, ErrUnauthorized
// or ErrNotSchemaRegistry, or as it is (an outage), its text bounded
// (MaxErrorText). The schema-first formats classify their own requests
// with it.
func Classify(subject string, err error) error {
	err = registryError(err)
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case NotFound(re):
			return fmt.Errorf("subject %s: %w: %v", subject, ErrNotRegistered, err)
		case re.StatusCode == http.StatusNotFound:
			return wrongPath("subject "+subject, re)
		case re.StatusCode == http.StatusConflict || re.StatusCode == http.StatusUnprocessableEntity || re.StatusCode == http.StatusRequestEntityTooLarge:
			return fmt.Errorf("subject %s: %w: %v", subject, ErrRefused, err)
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return fmt.Errorf("subject %s: %w (HTTP %d): %v", subject, ErrUnauthorized, re.StatusCode, err)
		}
	}
	return fmt.Errorf("schema registry, subject %s: %w", subject, err)
}

// MaxErrorText bounds the text of a registry's error in walrelay's
// errors: an error's text is the answer's body when it is not the API's
// JSON (a proxy's HTML page, up to the answers' bound), and it goes into
// the log at each retry and into a dead letter's walrelay.error header.
const MaxErrorText = 1000

// bounded is an error whose text is cut to MaxErrorText bytes; errors.Is
// and errors.As see the error it wraps.
type bounded struct{ err error }

func (b bounded) Error() string {
	s := b.err.Error()
	if len(s) <= MaxErrorText {
		return s
	}
	return textcut.Prefix(s, MaxErrorText) + fmt.Sprintf("… (%d bytes)", len(s))
}

func (b bounded) Unwrap() error { return b.err }

// ErrSchemaTooLarge is a registry's schema that is not compiled: with its
// references, more than Config.MaxCompiledSchemaBytes of text, or
// more than MaxReferences references. It is ErrNotRegistered too (a
// schema that cannot be used: walrelay dead-letters the event
// schema_refused, the inbox the record undecodable).
var ErrSchemaTooLarge = errors.New("the schema is too large to compile")

// schemaTooLargeError is an ErrSchemaTooLarge (and ErrNotRegistered).
type schemaTooLargeError struct{ why string }

func (e *schemaTooLargeError) Error() string { return e.why }
func (e *schemaTooLargeError) Is(target error) bool {
	return target == ErrSchemaTooLarge || target == ErrNotRegistered
}

// schemaTooLarge is an ErrSchemaTooLarge saying why.
func schemaTooLarge(why string) error { return &schemaTooLargeError{why} }

// checkID refuses a schema id that no registry can have before any
// request names it: the wire format carries 4 bytes, but a registry's id
// is a Java int (Confluent's, Apicurio's), so an id of 2^31 or more (a
// hostile or corrupt frame) is ErrSchemaUnknown. Asked for it, Apicurio
// cannot read the path's id and answers a 404 without Confluent's error
// code, which idError would read as a wrong URL: an outage, retried for
// ever on one event.
func checkID(id uint32) error {
	if id > math.MaxInt32 {
		return fmt.Errorf("%w: an id above %d, which no registry gives (a Java int)", ErrSchemaUnknown, math.MaxInt32)
	}
	return nil
}

// idError classifies the registry's error to a request about a schema id
// (what): ErrSchemaUnknown for Confluent's not found, ErrNotSchemaRegistry
// for a 404 without its code, ErrUnauthorized, else an outage.
func idError(what string, err error) error {
	err = registryError(err)
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case NotFound(re):
			return fmt.Errorf("%s: %w: %v", what, ErrSchemaUnknown, err)
		case re.StatusCode == http.StatusNotFound:
			return wrongPath(what, re)
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%s: %w (HTTP %d): %v", what, ErrUnauthorized, re.StatusCode, err)
		}
	}
	return fmt.Errorf("schema registry, %s: %w", what, err)
}

// maxReason bounds a registry's error text quoted in walrelay's own
// errors (an event's type, an answer's message).
const maxReason = 300

// clip cuts s to maxReason bytes, on a character boundary.
func clip(s string) string { return textcut.Clip(s, maxReason) }

// ErrInvalid is a schema that walrelay cannot use (it does not parse or
// compile, or is of another kind than the format's), found before it is
// sent to the registry.
var ErrInvalid = errors.New("walrelay cannot use the schema")

// Outage reports whether a registry's error is an outage (no answer, a
// timeout, a 5xx): one that retrying later may fix, as opposed to a
// refusal, credentials refused, a schema id the registry does not have
// (ErrSchemaUnknown), or a schema walrelay cannot use.
func Outage(err error) bool {
	return err != nil && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrUnauthorized) &&
		!errors.Is(err, ErrNotRegistered) && !errors.Is(err, ErrSchemaUnknown) && !errors.Is(err, ErrInvalid) &&
		!errors.Is(err, context.Canceled)
}
