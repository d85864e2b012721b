package schemafirst

import (
	"testing"

	"github.com/walrelay/walrelay/format"
	"github.com/walrelay/walrelay/format/registry"
)

func mustRegistry(t *testing.T, cfg registry.Config) *registry.Client {
	t.Helper()
	reg, err := registry.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func mustPassthrough(t *testing.T, reg *registry.Client, cfg format.PassthroughConfig) *format.Passthrough {
	t.Helper()
	p, err := format.NewPassthrough(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
