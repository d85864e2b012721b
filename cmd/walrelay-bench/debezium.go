package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/testkit/kafkatest"
	"github.com/walrelay/walrelay/internal/testkit/pgtest"
)

// debezium runs Debezium's PostgreSQL connector with its outbox event
// router, in a Kafka Connect standalone worker, on the slot and into the
// real broker: the reference connector on the same WAL range and the same
// finish line (the slot's confirmed_flush_lsn reaching the end). The clock
// starts when the connector has taken the slot, so the JVM's start-up is not
// counted; Debezium confirms its position when it commits offsets, every
// 100 ms here, and moves it past its last event with heartbeats, every
// 100 ms here.
func debezium(ctx context.Context, pg *pgtest.Server, slot string, end pglogrepl.LSN, _ int) (result, error) {
	addrs, prefix, _, err := realBrokers()
	if err != nil {
		return result{}, err
	}
	// Outbox-shaped as walrelay publishes: key aggregateid, value the
	// payload as stored, a topic per aggregate type, id and type in
	// headers.
	worker, connector := kafkatest.DebeziumOutbox(addrs, pg.Port(), slot, "dbz"+strings.TrimSuffix(prefix, "."), prefix+"outbox.event.${routedByValue}")
	connector["name"] = "bench-outbox-" + slot
	connector["tombstones.on.delete"] = "false"
	connector["transforms.outbox.table.fields.additional.placement"] = "type:header:type"
	c, err := kafkatest.StartDebezium(ctx, worker, connector)
	if err != nil {
		return result{}, err
	}
	defer c.Stop()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		return result{}, err
	}
	defer conn.Close(context.Background())
	failed := func(what string) error { return fmt.Errorf("debezium %s:\n%s", what, c.Logs()) }
	var began time.Time
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var active bool
		var text string
		if err := conn.QueryRow(ctx, "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active, &text); err != nil {
			return result{}, err
		}
		if active && began.IsZero() {
			began = time.Now()
		}
		if lsn, _ := pglogrepl.ParseLSN(text); lsn >= end && !began.IsZero() {
			break
		}
		select {
		case <-c.Done():
			return result{}, failed("exited")
		default:
		}
		if time.Now().After(deadline) {
			return result{}, failed("did not confirm " + end.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(began)
	rss, cpu := procStats(c.Pid())
	return result{elapsed: elapsed, rss: rss, cpu: cpu}, nil
}
