//go:build race

package schemafirst

// raceEnabled: the race detector allocates more than the product does, so
// the calibrations of the decoded-cost estimates are skipped.
const raceEnabled = true
