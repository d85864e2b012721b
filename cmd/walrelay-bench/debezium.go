package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/walrelay/walrelay/internal/kafkatest"
	"github.com/walrelay/walrelay/internal/pgtest"
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
	c, err := kafkatest.StartDebezium(ctx, map[string]string{
		"bootstrap.servers": strings.Join(addrs, ","),
		"key.converter":     "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":   "org.apache.kafka.connect.storage.StringConverter",
	}, map[string]string{
		// Outbox-shaped as walrelay publishes: key aggregateid, value the
		// payload as stored, a topic per aggregate type, id and type in
		// headers.
		"name":                        "bench-outbox-" + slot,
		"connector.class":             "io.debezium.connector.postgresql.PostgresConnector",
		"plugin.name":                 "pgoutput",
		"database.hostname":           "127.0.0.1",
		"database.port":               fmt.Sprint(pg.Port()),
		"database.user":               "postgres",
		"database.dbname":             "postgres",
		"topic.prefix":                "dbz" + strings.TrimSuffix(prefix, "."),
		"slot.name":                   slot,
		"publication.name":            "walrelay_outbox",
		"publication.autocreate.mode": "disabled",
		"snapshot.mode":               "no_data",
		"table.include.list":          "public.outbox",
		"tombstones.on.delete":        "false",
		// Without heartbeats Debezium confirms only the position of its
		// last event, never the WAL after it: the slot would not reach
		// the finish line (nor stop holding WAL on an idle outbox).
		"heartbeat.interval.ms":                               "100",
		"transforms":                                          "outbox",
		"transforms.outbox.type":                              "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.route.topic.replacement":           prefix + "outbox.event.${routedByValue}",
		"transforms.outbox.table.fields.additional.placement": "type:header:type",
	})
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
