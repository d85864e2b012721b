package config

import (
	"strings"
)

// defaultMeaning says what a key's default means where its value alone
// does not (an empty value reads "none").
var defaultMeaning = map[string]string{
	"postgres.dsn":               "required",
	"kafka.brokers":              "required",
	"kafka.transactional_id":     "derived",
	"kafka.tls.ca_file":          "the system's CAs",
	"kafka.tls.server_name":      "each broker's host",
	"poll.worker_id":             "none: `host-pid`",
	"heartbeat.interval":         "`0s` (off)",
	"postgres.max_message_bytes": "`0`: 2 × `kafka.batch_max_bytes` + 1 MiB (about 2.9 MiB by default): a larger record could not be published anyway (a bytea payload arrives in hex, twice its size)",
	"memory_limit":               "`0`: `kafka.max_buffered_bytes` + 16 MiB (32 MiB with the default buffers)",
}

// Reference renders every key, with its variable, its default and its
// meaning, as the Markdown table of docs/configuration.md, which is
// generated from it (go test ./config -run TestConfigurationReference
// -update).
func Reference() string {
	var c Config
	var b strings.Builder
	b.WriteString("| key (variable) | default | meaning |\n| --- | --- | --- |\n")
	for _, k := range c.keys() {
		def := defaultMeaning[k.name]
		switch {
		case def != "":
		case k.show() == "":
			def = "none"
		default:
			def = "`" + k.show() + "`"
		}
		b.WriteString("| `" + k.name + "` (`" + EnvName(k.name) + "`) | " + def + " | " + k.help + " |\n")
	}
	return b.String()
}
