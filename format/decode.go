package format

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// DecodeAvroWith is DecodeAvro with the schema already parsed (a
// consumer's cache of the registry's schemas by id).
func DecodeAvroWith(s avro.Schema, body []byte) (any, error) {
	var v any
	if err := avro.Unmarshal(s, body, &v); err != nil {
		return nil, fmt.Errorf("decode in Avro: %w", err)
	}
	return unwrap(s, v), nil
}
