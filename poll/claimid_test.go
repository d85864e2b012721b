package poll

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/sink"
)

// TestClaimIDsUniquePerStart: two starts with one worker id (containers
// that share a hostname and run as pid 1, or a shared
// WALRELAY_POLL_WORKER_ID) make different claim ids, so the mark of the
// first, a zombie whose lease expired, does not touch the rows the second
// claimed since. Before, both made "w:1", and the zombie set the new
// owner's row back to PENDING.
func TestClaimIDsUniquePerStart(t *testing.T) {
	t.Parallel()
	conn, tb := claimFixture(t, Config{Ordering: OrderAggregate})
	cc, _ := pgx.ParseConfig("postgres://u@127.0.0.1:1/db")
	start := func() *Poller {
		p, err := New(Config{ConnConfig: cc, WorkerID: "w", Sink: sink.Config{Brokers: []string{"127.0.0.1:1"}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.sink.Close)
		return p
	}
	zombie, owner := start(), start()
	ids := map[string]string{}
	insert(t, conn, ids, "a")
	first := zombie.nextClaim()
	if got := claimNames(t, conn, tb, first, ids); len(got) != 1 {
		t.Fatalf("first claim: %v", got)
	}
	set(t, conn, ids["a-0"], "lease_until = now() - interval '1 second'") // the zombie paused past its lease
	second := owner.nextClaim()
	if got := claimNames(t, conn, tb, second, ids); len(got) != 1 {
		t.Fatalf("the new owner's claim: %v", got)
	}
	var m marks
	m.add(ids["a-0"], "PENDING", 0, 1, "")
	n, err := tb.mark(t.Context(), conn, first, &m)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 || first == second {
		t.Fatalf("claim ids %q and %q: the zombie's mark changed %d rows of the new owner's claim", first, second, n)
	}
}
