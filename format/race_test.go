//go:build race

package format

// raceEnabled: the race detector allocates more than the product does, so
// the calibrations of the decoded-cost estimates are skipped.
const raceEnabled = true
