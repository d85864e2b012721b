package registry

import "testing"

func mustRegistry(t *testing.T, cfg Config) *Client {
	t.Helper()
	reg, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
