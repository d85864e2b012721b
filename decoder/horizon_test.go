package decoder

import "testing"

// TestWiden: a 32-bit xid is widened to the full id nearest the last one,
// across the epoch boundary either way.
func TestWiden(t *testing.T) {
	const epoch = uint64(1) << 32
	tests := []struct {
		name string
		last uint64
		x    uint32
		want uint64
	}{
		{"same epoch, later", 5*epoch + 100, 200, 5*epoch + 200},
		{"same epoch, earlier", 5*epoch + 200, 100, 5*epoch + 100},
		{"next epoch", 5*epoch + 0xFFFFFF00, 10, 6*epoch + 10},
		{"previous epoch", 6*epoch + 10, 0xFFFFFF00, 5*epoch + 0xFFFFFF00},
		{"first epoch", 100, 0xFFFFFF00, 0xFFFFFF00},
		{"zero", 0, 700, 700},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := widen(tt.last, tt.x); got != tt.want {
				t.Errorf("widen(%d, %d) = %d, want %d", tt.last, tt.x, got, tt.want)
			}
		})
	}
}
