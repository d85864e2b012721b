// Package faultinject holds hooks that tests compile into the walrelay
// binary with the build tag faultinject, to crash it at exact points of the
// data path. Without the tag every hook is a no-op that the compiler drops.
package faultinject
