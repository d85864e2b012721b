package main

import (
	"context"
	"fmt"

	"github.com/walrelay/walrelay/internal/testkit/registrytest"
)

// startRegistry starts a real Apicurio Registry for the registry format's
// row (-registry) and returns its stop.
func startRegistry(ctx context.Context, o *options) (func(), error) {
	r, err := registrytest.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("start Apicurio Registry %s: %w", registrytest.Version, err)
	}
	o.registryURL = r.URL()
	return r.Close, nil
}

// registryContender is walrelay writing keys and values in Avro (Apicurio's
// AvroConverter's bytes, the JSON payload expanded into a record), its
// schemas registered in the real registry: the first event of each shape
// registers its schema (one request per key and value subject per run), the
// others find the id cached, so this is the steady state's cost of the
// format, into kfake, the same finish line as the raw format's row.
func registryContender(o options) contender {
	env := []string{"WALRELAY_KAFKA_KEY_FORMAT=avro", "WALRELAY_KAFKA_VALUE_FORMAT=avro", "WALRELAY_KAFKA_EXPAND_JSON_PAYLOAD=true",
		"WALRELAY_KAFKA_SCHEMA_REGISTRY_URL=" + o.registryURL, "WALRELAY_KAFKA_SCHEMA_REGISTRY_AUTO_REGISTER=true"}
	return contender{"walrelay, **`avro`** key and value (the payload expanded, schemas in a real Apicurio Registry " + registrytest.Version + ", ids cached after each shape's first) into kfake, the same finish line",
		walrelay(o.bin, kfakeBrokers, 1, env...), "walrelay avro into kfake"}
}
