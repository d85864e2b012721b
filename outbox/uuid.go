package outbox

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

var ids struct {
	mu   sync.Mutex
	last int64  // milliseconds of the last id
	seq  uint16 // 12-bit counter within that millisecond
}

// NewID returns a new UUIDv7 (RFC 9562) as a string: 48 bits of Unix
// milliseconds, then a 12-bit counter that keeps ids of one process in
// order within a millisecond (method 1 of the RFC), then 62 random bits.
// Ids sort by creation time, which keeps the outbox's primary key index
// appending and lets tools find a time window by id.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	ids.mu.Lock()
	ms := time.Now().UnixMilli()
	if ms <= ids.last {
		// The same millisecond (or a clock that stepped back): count on
		// from the last id; a counter that overflows borrows the next
		// millisecond.
		ids.seq++
		if ids.seq > 0xfff {
			ids.last++
			ids.seq = 0
		}
		ms = ids.last
	} else {
		ids.last, ids.seq = ms, binary.BigEndian.Uint16(b[6:8])&0x7ff // a random start, leaving room to count
	}
	seq := ids.seq
	ids.mu.Unlock()
	b[0], b[1], b[2], b[3], b[4], b[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	b[6] = 0x70 | byte(seq>>8)
	b[7] = byte(seq)
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// IDTime returns the time embedded in a UUIDv7 id, and false if id is not
// a UUIDv7.
func IDTime(id string) (time.Time, bool) {
	if len(id) != 36 || id[14] != '7' || id[8] != '-' || id[13] != '-' {
		return time.Time{}, false
	}
	var b [6]byte
	if _, err := hex.Decode(b[:4], []byte(id[0:8])); err != nil {
		return time.Time{}, false
	}
	if _, err := hex.Decode(b[4:], []byte(id[9:13])); err != nil {
		return time.Time{}, false
	}
	ms := int64(b[0])<<40 | int64(b[1])<<32 | int64(b[2])<<24 | int64(b[3])<<16 | int64(b[4])<<8 | int64(b[5])
	return time.UnixMilli(ms), true
}
