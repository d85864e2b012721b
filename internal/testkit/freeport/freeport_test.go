package freeport

import "testing"

func TestGetOutsideTheEphemeralRange(t *testing.T) {
	ports, err := Get(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	high := ephemeralLow()
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d twice in %v", p, ports)
		}
		seen[p] = true
		if high-low >= 1000 && (p < low || p >= high) {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
	}
}
