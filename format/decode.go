package format

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// DecodeAvroWith is DecodeAvro with the schema already parsed (a
// consumer's cache of the registry's schemas by id) and the hamba/avro
// configuration to decode with (which keeps a decoder per schema as long
// as it lives: a consumer's, that goes with its cache, rather than
// hamba/avro's package-wide DefaultConfig, which keeps them for ever).
func DecodeAvroWith(api avro.API, s avro.Schema, body []byte) (any, error) {
	var v any
	if err := api.Unmarshal(s, body, &v); err != nil {
		return nil, fmt.Errorf("decode in Avro: %w", err)
	}
	return unwrap(s, v), nil
}
