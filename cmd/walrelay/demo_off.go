//go:build !demo

package main

import (
	"context"
	"errors"
	"io"
)

// cmdDemo says how to get the demo: it links the test harness, which the
// connector's binary leaves out (demo.go).
func cmdDemo(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("this binary is built without the demo: go run -tags demo ./cmd/walrelay demo --count 10")
}
