package schemafirst

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestSchemaFirstCacheEvictsOneAtATime (a registry over loopback counting
// its requests by subject): a writer cycling through more subjects than
// the cache of compiled schemas holds (maxCachedSchemas) drops the least
// recently used one at a time: a subject in use meanwhile stays cached
// (read once), and one dropped keeps its bound on reading again after a
// mismatch (read again when next used, not again for the mismatch within
// MismatchReadInterval). The cache used to be cleared whole when full,
// with the bounds on reading again: every subject read again.
func TestSchemaFirstCacheEvictsOneAtATime(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Second
	const others = maxCachedSchemas + 100
	ss := newSubjectRegistry(t)
	record := func(name string) string {
		return fmt.Sprintf(`{"type":"record","name":%q,"fields":[{"name":"id","type":"long"}]}`, name)
	}
	ss.register("Hot", 1, record("Hot"))
	ss.register("Mismatched", 2, record("Mismatched"))
	for i := range others {
		ss.register(fmt.Sprintf("C%d", i), 10+i, record(fmt.Sprintf("C%d", i)))
	}
	enc := schemaFirst(t, ss.url, Config{Kind: KindAvro, LatestTTL: time.Hour, MismatchReadInterval: interval})
	var clock atomic.Int64
	start := time.Now()
	enc.now = func() time.Time { return start.Add(time.Duration(clock.Load())) }
	value := func(subject, payload string) error {
		_, err := enc.Value(t.Context(), "orders", subject, []byte(payload), 0)
		return err
	}
	if err := value("Mismatched", `{"id": 1, "nope": 1}`); err == nil {
		t.Fatal("a mismatch written")
	}
	if got := ss.of("Mismatched"); got != 2 {
		t.Fatalf("a mismatch: %d requests, want 2 (the first read, one reading again)", got)
	}
	for i := range others {
		if err := value(fmt.Sprintf("C%d", i), `{"id": 1}`); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			if err := value("Hot", `{"id": 1}`); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := ss.of("Hot"); got != 1 {
		t.Errorf("a subject in use while %d others cycle through the cache: %d requests, want 1", others, got)
	}
	wantMismatch(t, "a mismatch after the cache dropped its subject", value("Mismatched", `{"id": 1, "nope": 1}`), "/nope")
	if got := ss.of("Mismatched"); got != 3 {
		t.Errorf("a mismatch within the interval, its subject dropped from the cache meanwhile: %d requests in all, want 3 (read again once, not again for the mismatch)", got)
	}
	if got, want := ss.requests.Load(), int64(others+4); got > want {
		t.Errorf("%d subjects cycled once: %d requests, want at most %d", others, got, want)
	}
}

// TestSchemaFirstUnusableCyclingBounded: a writer cycling twice through
// more subjects the registry lacks than the cache of compiled schemas
// holds, within the interval, costs one request per subject: what is
// remembered of a subject is kept apart from that cache (up to
// maxSubjectReads subjects). Each event used to ask.
func TestSchemaFirstUnusableCyclingBounded(t *testing.T) {
	t.Parallel()
	const subjects = maxCachedSchemas + 100
	ss := newSubjectRegistry(t)
	enc := schemaFirst(t, ss.url, Config{Kind: KindAvro})
	start := time.Now()
	enc.now = func() time.Time { return start }
	for range 2 {
		for i := range subjects {
			if _, err := enc.Value(t.Context(), "orders", fmt.Sprintf("Missing%d", i), []byte(`{"id": 1}`), 0); err == nil {
				t.Fatal("an event of a missing subject written")
			}
		}
	}
	if got := ss.requests.Load(); got != subjects {
		t.Errorf("%d missing subjects cycled twice within the interval: %d requests, want %d", subjects, got, subjects)
	}
}
