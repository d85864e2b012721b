//go:build !faultinject

package faultinject

// Acked is called after Kafka acknowledged an event and before the
// checkpoint learns of it. Without the faultinject tag it does nothing.
func Acked() {}

// Reached is called at a named point of the data path (see on.go). Without
// the faultinject tag it does nothing.
func Reached(point string) {}

// Vars are the environment variables of this build's crash points: none.
var Vars []string
