package deadletter

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestClip: a text over max bytes keeps its first whole runes, ends in "…"
// and its length, and takes max bytes at most; one within max is whole.
func TestClip(t *testing.T) {
	t.Parallel()
	if got := string(Clip("short", 10)); got != "short" {
		t.Fatalf("Clip(short) = %q", got)
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := string(Clip(long, 100))
	if len(got) > 100 || !utf8.ValidString(got) || !strings.HasSuffix(got, "… (2000 bytes)") || !strings.HasPrefix(long, strings.TrimSuffix(got, "… (2000 bytes)")) {
		t.Fatalf("Clip = %q (%d bytes): want at most 100 bytes of whole runes, a prefix and its length", got, len(got))
	}
}

// TestFit: Fit leaves out the key and the headers it may, the largest
// first and only as many as the excess needs; only then does it cut the
// id, to the longest prefix that fits; and it says both.
func TestFit(t *testing.T) {
	t.Parallel()
	rec := func() *kgo.Record {
		return &kgo.Record{Key: []byte(strings.Repeat("k", 300)), Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte(strings.Repeat("i", 5000))},
			{Key: "small", Value: []byte("s")},
			{Key: "big", Value: []byte(strings.Repeat("b", 1000))},
			{Key: "walrelay.error", Value: []byte(strings.Repeat("e", 1000))},
		}}
	}
	shed := func(i int) bool { return i < 3 }
	r := rec()
	if o, io := Fit(r, 500, shed, 0); o != len("big")+1000 || io != 0 || string(r.Key) != strings.Repeat("k", 300) {
		t.Fatalf("over by 500: omitted %d, id omitted %d, key %d bytes: want the big header alone left out", o, io, len(r.Key))
	}
	r = rec()
	before := Size(r)
	o, io := Fit(r, 4000, shed, 0)
	id := string(r.Headers[0].Value)
	if o != 300+len("big")+1000+len("small")+1 || io == 0 || io != 5000-len(id) || len(id) < 5000-4000-3*note {
		t.Fatalf("over by 4000: omitted %d, id omitted %d (id %d bytes): want the key and both headers left out, then the id cut", o, io, len(id))
	}
	if Size(r) > before-4000 {
		t.Fatalf("size %d, want at most %d", Size(r), before-4000)
	}
	if got := r.Headers[1].Key; got != "walrelay.error" {
		t.Fatalf("header kept %q: walrelay's headers stay", got)
	}
	if r := rec(); func() bool { o, io := Fit(r, 0, shed, 0); return o != 0 || io != 0 || len(r.Headers) != 4 }() {
		t.Fatal("a record within its cap changed")
	}
}
