package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/walrelay/walrelay/format/registry"
)

// converterOptions name Kafka Connect's key, value and header converters.
var converterOptions = []string{"key.converter", "value.converter", "header.converter"}

// converterOf is the converter option (key.converter, value.converter,
// header.converter) that option is or is a setting of, "" if none.
func converterOf(option string) string {
	for _, cv := range converterOptions {
		if option == cv || strings.HasPrefix(option, cv+".") {
			return cv
		}
	}
	return ""
}

// registryURLWhy says why a converter's registry URL is refused, "" if it
// is not: walrelay would refuse it at load as it refuses
// kafka.schema_registry.url (registry.CheckURL), and the import
// would have printed it, credentials and all, in the YAML the operator
// keeps. The reason never quotes the URL.
func registryURLWhy(u string) string {
	// Any '@' first: "user:pw@registry:8081" without its scheme is not
	// a URL with a user to CheckRegistryURL, but its password all the same.
	if strings.Contains(u, "@") {
		return "credentials in the URL: give the user in kafka.schema_registry.username and the password in kafka.schema_registry.password_file"
	}
	switch err := registry.CheckURL(u); {
	case errors.Is(err, registry.ErrURLQuery):
		return "a query or fragment in the URL (?… or #…, a token as ?access_token= too), which errors would print: give credentials in kafka.schema_registry.username and kafka.schema_registry.password_file, or a client certificate in kafka.schema_registry.tls_cert_file and kafka.schema_registry.tls_key_file"
	case err != nil:
		return "want an http or https URL with a host (http://host:port/path)"
	}
	return ""
}

// registryFromDebezium maps the settings of an AvroConverter (Apicurio's
// if apicurio, else Confluent's) at option (key.converter,
// value.converter) onto kafka.schema_registry.*: the URL, auto-registration
// and the basic auth user (the password is not copied). Apicurio's must
// write Confluent's framing with content ids in the value
// (as-confluent=true, use-id=contentId, headers.enabled=false), what
// walrelay writes; its other settings, and
// Confluent's other than these, are refused as unknown options (they may
// change the records). Key and value converters must name one registry.
func registryFromDebezium(option string, apicurio bool, get func(string, string) string, refuse func(string, string), keys map[string]string, ignored *[]DebeziumNote) {
	set := func(key, v, from string) {
		if old, ok := keys[key]; ok && old != v {
			refuse(from, fmt.Sprintf("the key and value converters name different schema registries or settings (%s): walrelay has one", key))
			return
		}
		keys[key] = v
	}
	p := option + "."
	if apicurio {
		u := get(p+"apicurio.registry.url", "")
		switch {
		case u == "":
			refuse(p+"apicurio.registry.url", "not set")
		case registryURLWhy(u) != "":
			refuse(p+"apicurio.registry.url", registryURLWhy(u))
		case strings.HasSuffix(strings.TrimSuffix(u, "/"), "/apis/registry/v2"):
			// walrelay speaks Confluent's API, which Apicurio 2 serves
			// beside its own.
			set("kafka.schema_registry.url", strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/apis/registry/v2")+"/apis/ccompat/v7", p+"apicurio.registry.url")
		default:
			refuse(p+"apicurio.registry.url", "not Apicurio 2's API (…/apis/registry/v2): give walrelay the registry's Confluent-compatible URL in kafka.schema_registry.url")
		}
		if v := get(p+"apicurio.registry.as-confluent", "false"); v != "true" {
			refuse(p+"apicurio.registry.as-confluent", v+": walrelay writes Confluent's framing (magic byte 0, a 4-byte id), as-confluent=true; Apicurio's own framing (an 8-byte id) is not reproduced")
		}
		if v := get(p+"apicurio.registry.headers.enabled", "true"); v != "false" {
			refuse(p+"apicurio.registry.headers.enabled", v+": walrelay writes the schema id in the value (headers.enabled=false); Apicurio's id in a record header is not reproduced")
		}
		if v := get(p+"apicurio.registry.use-id", "globalId"); v != "contentId" {
			refuse(p+"apicurio.registry.use-id", v+": walrelay frames the id Confluent's API gives, Apicurio's content id (use-id=contentId)")
		}
		auto := get(p+"apicurio.registry.auto-register", "false")
		if auto != "true" && auto != "false" {
			refuse(p+"apicurio.registry.auto-register", "want true or false")
		} else {
			set("kafka.schema_registry.auto_register", auto, p+"apicurio.registry.auto-register")
		}
		if user := get(p+"apicurio.auth.username", ""); user != "" {
			set("kafka.schema_registry.username", user, p+"apicurio.auth.username")
		}
		if get(p+"apicurio.auth.password", "") != "" {
			*ignored = append(*ignored, DebeziumNote{p + "apicurio.auth.password", "the password is not copied: give it in kafka.schema_registry.password_file or WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD"})
		}
		return
	}
	u := get(p+"schema.registry.url", "")
	switch {
	case u == "":
		refuse(p+"schema.registry.url", "not set")
	case strings.Contains(u, ","):
		refuse(p+"schema.registry.url", "several URLs: walrelay takes one")
	case registryURLWhy(u) != "":
		refuse(p+"schema.registry.url", registryURLWhy(u))
	default:
		set("kafka.schema_registry.url", u, p+"schema.registry.url")
	}
	auto := get(p+"auto.register.schemas", "true")
	if auto != "true" && auto != "false" {
		refuse(p+"auto.register.schemas", "want true or false")
	} else {
		set("kafka.schema_registry.auto_register", auto, p+"auto.register.schemas")
	}
	switch src := get(p+"basic.auth.credentials.source", "URL"); src {
	case "URL":
	case "USER_INFO":
		info := get(p+"basic.auth.user.info", get(p+"schema.registry.basic.auth.user.info", ""))
		if user, _, ok := strings.Cut(info, ":"); ok && user != "" {
			set("kafka.schema_registry.username", user, p+"basic.auth.user.info")
			*ignored = append(*ignored, DebeziumNote{p + "basic.auth.user.info", "the password is not copied: give it in kafka.schema_registry.password_file or WALRELAY_KAFKA_SCHEMA_REGISTRY_PASSWORD"})
		} else {
			refuse(p+"basic.auth.user.info", "want user:password")
		}
	default:
		refuse(p+"basic.auth.credentials.source", src+": walrelay takes USER_INFO (HTTP basic auth)")
	}
}
