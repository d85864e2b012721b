package registry

import (
	"bytes"
	"testing"
)

// TestFrame: Confluent's wire format, magic byte 0 and a big-endian id.
func TestFrame(t *testing.T) {
	b := Frame(nil, 0x01020304, []byte{9})
	if !bytes.Equal(b, []byte{0, 1, 2, 3, 4, 9}) {
		t.Fatalf("framed %x", b)
	}
	id, body, err := Unframe(b)
	if err != nil || id != 0x01020304 || !bytes.Equal(body, []byte{9}) {
		t.Fatalf("unframed %d %x %v", id, body, err)
	}
	for _, bad := range [][]byte{nil, {0, 1, 2, 3}, {1, 0, 0, 0, 1}} {
		if _, _, err := Unframe(bad); err == nil {
			t.Errorf("%x: unframed", bad)
		}
	}
}
