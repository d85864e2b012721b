package schemafirst

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/walrelay/walrelay/format/registry"
)

// Registering the schema-first formats' schemas: only when asked
// (registry.Config.AutoRegister), only the schemas that the operator
// supplies, and only when the caller says (walrelay does at start, before
// any event); never a schema inferred from a payload.

var (
	// ErrIncompatible is a schema that the subject's compatibility rule
	// refuses (HTTP 409): the operator changes the schema or the rule.
	// It is an ErrRefused.
	ErrIncompatible = fmt.Errorf("%w: incompatible with the subject's versions under its compatibility rule", registry.ErrRefused)
)

// Registered is a schema registered under a subject: its id (the one
// that frames the records) and version, and the subject's latest version
// (another when the schema was an older version already: registering it
// again does not make it the latest).
type Registered struct {
	ID, Version, Latest int
}

// local is text as a schema of the format's kind, once walrelay has
// parsed or compiled it as it would the registry's (without references:
// a supplied schema has none).
func (s *Encoder) local(ctx context.Context, text string) (sr.Schema, error) {
	schema := sr.Schema{Schema: text, Type: schemaType(s.cfg.Kind)}
	if _, err := s.compile(ctx, sr.SubjectSchema{Schema: schema}, nil); err != nil {
		return sr.Schema{}, fmt.Errorf("%w: %w", registry.ErrInvalid, err)
	}
	return schema, nil
}

// schemaType is the registry's type of a kind of schema.
func schemaType(kind string) sr.SchemaType {
	switch kind {
	case KindProtobuf:
		return sr.TypeProtobuf
	case KindJSONSchema:
		return sr.TypeJSON
	}
	return sr.TypeAvro
}

// Register registers text, a schema of the format's kind, under subject,
// and returns its id and version: a new version if the subject does not
// hold that schema yet, the existing one if it does (the registry's
// rule). It refuses when auto-registration is off. Errors: ErrInvalid
// (before any request), ErrIncompatible, ErrRefused (the registry finds
// it invalid), ErrUnauthorized, or an outage (Outage).
func (s *Encoder) Register(ctx context.Context, subject, text string) (Registered, error) {
	if !s.reg.AutoRegister() {
		return Registered{}, fmt.Errorf("subject %s: auto-registration is off: walrelay registers nothing", subject)
	}
	schema, err := s.local(ctx, text)
	if err != nil {
		return Registered{}, fmt.Errorf("subject %s: %w", subject, err)
	}
	if _, err := s.reg.Register(ctx, subject, schema); err != nil {
		return Registered{}, registerError(subject, err)
	}
	// The id and the version: registering answers the id alone.
	ss, err := s.reg.Client().LookupSchema(ctx, subject, schema)
	if err != nil {
		return Registered{}, registry.Classify(subject, err)
	}
	got := Registered{ID: ss.ID, Version: ss.Version, Latest: ss.Version}
	if latest, err := s.reg.Client().SchemaByVersion(ctx, subject, -1); err == nil {
		got.Latest = latest.Version
	}
	return got, nil
}

// Plan says what Register would do with text under subject, registering
// nothing: that the subject holds it already (its version and id), or
// that it would be a new version (compatible with the latest), or the
// first version of a new subject. Errors as Register's; ErrIncompatible
// when the registry says it would refuse it.
func (s *Encoder) Plan(ctx context.Context, subject, text string) (string, error) {
	schema, err := s.local(ctx, text)
	if err != nil {
		return "", fmt.Errorf("subject %s: %w", subject, err)
	}
	ss, err := s.reg.Client().LookupSchema(ctx, subject, schema)
	if err == nil {
		plan := fmt.Sprintf("registered already: version %d, id %d", ss.Version, ss.ID)
		if latest, err := s.reg.Client().SchemaByVersion(ctx, subject, -1); err == nil && latest.Version != ss.Version {
			// Registering it again gives this version back: the latest
			// stays what `latest` writes.
			plan += fmt.Sprintf(", not the latest (version %d, which the subject's latest writes)", latest.Version)
		}
		return plan, nil
	}
	var re *sr.ResponseError
	if !errors.As(err, &re) || !registry.NotFound(re) {
		return "", registry.Classify(subject, err)
	}
	if re.ErrorCode == 40401 { // subject not found
		return "would register it as version 1 of a new subject", nil
	}
	res, err := s.reg.Client().CheckCompatibility(ctx, subject, -1, schema)
	if err != nil {
		return "", registry.Classify(subject, err)
	}
	if !res.Is {
		why := ""
		for _, m := range res.Messages {
			why += ": " + m
		}
		return "", fmt.Errorf("subject %s: %w (the registry's compatibility check: it would refuse it)%s", subject, ErrIncompatible, clip(why))
	}
	return "would register it as a new version (compatible with the latest, as the subject's rule asks)", nil
}

// registerError classifies a registration's error: 409, the subject's
// compatibility rule refusing the schema, is ErrIncompatible; the rest as
// classify says.
func registerError(subject string, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusConflict {
		return fmt.Errorf("subject %s: %w (HTTP 409): %s", subject, ErrIncompatible, clip(re.Message))
	}
	return registry.Classify(subject, err)
}
