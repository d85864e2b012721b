// Package lru orders the keys of a cache by their last use, so that a
// bounded cache drops one entry at a time, the least recently used,
// rather than all of them when it is full: a writer who cycles through
// more keys than the cache holds then evicts only what is not in use,
// and what a key remembers (when it was last read) is not reset by the
// use of others. The cache keeps its values in its own map; Order keeps
// only the keys. It is not safe for concurrent use: its owner's mutex
// guards it.
package lru

import "container/list"

// Order is keys by their last use, the most recent first. Its zero value
// is empty and ready to use.
type Order[K comparable] struct {
	l  list.List
	at map[K]*list.Element
}

// Touch makes k the most recently used, adding it if it is not there.
func (o *Order[K]) Touch(k K) {
	if e, ok := o.at[k]; ok {
		o.l.MoveToFront(e)
		return
	}
	if o.at == nil {
		o.at = map[K]*list.Element{}
	}
	o.at[k] = o.l.PushFront(k)
}

// Remove forgets k, if it is there.
func (o *Order[K]) Remove(k K) {
	if e, ok := o.at[k]; ok {
		o.l.Remove(e)
		delete(o.at, k)
	}
}

// Oldest is the least recently used key; ok is false if there is none.
func (o *Order[K]) Oldest() (k K, ok bool) {
	e := o.l.Back()
	if e == nil {
		return k, false
	}
	return e.Value.(K), true
}

// Len is the number of keys.
func (o *Order[K]) Len() int { return len(o.at) }

// MakeRoom drops from m, and from o, the least recently used keys of o
// until m holds fewer than most: room for one more. Keys of m that o does
// not hold are never dropped (so m may stay full of them).
func MakeRoom[K comparable, V any](o *Order[K], m map[K]V, most int) {
	Drop(o, m, func() bool { return len(m) >= most }, nil)
}

// Drop drops from m, and from o, the least recently used keys of o while
// full reports the cache full, handing each value dropped to gone (if not
// nil: a cache bounded by the size of its values too takes it off its
// total there). It stops when o holds no key.
func Drop[K comparable, V any](o *Order[K], m map[K]V, full func() bool, gone func(V)) {
	for full() {
		k, ok := o.Oldest()
		if !ok {
			return
		}
		if gone != nil {
			gone(m[k])
		}
		delete(m, k)
		o.Remove(k)
	}
}
