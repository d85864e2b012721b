package main

import (
	"github.com/walrelay/walrelay/cmd/walrelay/internal/admin"
	"github.com/walrelay/walrelay/config"
	"github.com/walrelay/walrelay/sink"
)

// watchRegistry has the schema registry of sc's registry formats, if any,
// report each request to m: its metric, status and log lines.
func watchRegistry(sc sink.Config, m *admin.Metrics) {
	if reg := config.RegistryOf(sc); reg != nil {
		m.UseRegistry()
		reg.OnRequest(m.RegistryRequest)
	}
}
