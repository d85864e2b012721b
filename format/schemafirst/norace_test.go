//go:build !race

package schemafirst

const raceEnabled = false
