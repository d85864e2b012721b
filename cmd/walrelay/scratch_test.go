package main

import (
	"testing"
	"time"
)

func TestScratchPollBacklog(t *testing.T) {
	pg, kc, col := setupPoll(t)
	conn := connect(t, pg.DSN)
	w := newWriter(50, 3)
	if err := w.write(t.Context(), conn, 100000, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "ANALYZE outbox"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := polling(t, pollEnv(pg, kc))
	waitAll(t, col, w.written(), 5*time.Minute)
	t.Logf("100000 backlog in %s", time.Since(start))
	_ = p
}
