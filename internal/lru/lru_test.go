package lru

import "testing"

// TestOrderOldestIsLeastRecentlyUsed: Touch moves a key to the front,
// Oldest names the one used longest ago, Remove forgets one.
func TestOrderOldestIsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	var o Order[string]
	if _, ok := o.Oldest(); ok {
		t.Fatal("an empty Order has an oldest key")
	}
	for _, k := range []string{"a", "b", "c"} {
		o.Touch(k)
	}
	o.Touch("a")
	if k, _ := o.Oldest(); k != "b" {
		t.Fatalf("oldest %q, want b", k)
	}
	o.Remove("b")
	if k, _ := o.Oldest(); k != "c" || o.Len() != 2 {
		t.Fatalf("oldest %q of %d, want c of 2", k, o.Len())
	}
	o.Remove("nothing")
	o.Remove("c")
	o.Remove("a")
	if _, ok := o.Oldest(); ok || o.Len() != 0 {
		t.Fatalf("%d keys left, want none", o.Len())
	}
}

// TestMakeRoomDropsLeastRecentlyUsed: MakeRoom drops the least recently
// used until there is room for one more, and never a key Order lacks.
func TestMakeRoomDropsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	var o Order[int]
	m := map[int]bool{}
	for k := range 4 {
		m[k] = true
		o.Touch(k)
	}
	o.Touch(0)
	MakeRoom(&o, m, 3)
	if len(m) != 2 || !m[0] || !m[3] {
		t.Fatalf("left %v, want 0 and 3", m)
	}
	m[9] = true // not in o
	MakeRoom(&o, m, 1)
	if len(m) != 1 || !m[9] || o.Len() != 0 {
		t.Fatalf("left %v (%d ordered), want 9 alone", m, o.Len())
	}
}
