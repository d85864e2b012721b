-- The two claims see each other. The two-argument claim of 0001_inbox.sql
-- (topic '', ids unique across everything read: services in other
-- languages, and consumers of walrelay before 0002 during a rolling
-- upgrade) and the per-topic claim of 0002_inbox_topic.sql write rows that
-- no unique key makes conflict, (consumer, '', id) and (consumer, topic,
-- id): alone, neither would wait for the other in flight, nor see the
-- other's row. So both take a transaction advisory lock keyed on the
-- table, the consumer and the event id (64-bit hash: a collision only
-- makes two claims wait for each other), the per-topic claim shared (per-
-- topic claims of one id on two topics are two events and never wait for
-- each other; two of one topic wait on the key), the two-argument claim
-- exclusive; each then looks in a statement of its own, whose snapshot
-- sees what the claim it waited for committed. Callers run in READ
-- COMMITTED (the default): a REPEATABLE READ transaction's snapshot is
-- older than the wait. The lock is held to the end of the transaction,
-- as the row is.

-- Claims an event of a topic for a consumer inside the caller's
-- transaction: true if it is new (the caller handles it, then commits),
-- false if the consumer already handled it under this topic, or under
-- topic '' (claimed before 0002, or by the two-argument claim, whose
-- topic is not known). A concurrent claim of the same event (under this
-- topic or by the two-argument claim) waits for the first transaction and
-- returns false once it commits. Package inbox calls it.
CREATE OR REPLACE FUNCTION {{claim}}(consumer text, topic text, event_id text) RETURNS boolean
LANGUAGE sql AS {{tag}}
    SELECT pg_advisory_xact_lock_shared(hashtextextended({{table_literal}} || '/' || $1 || '/' || $3, 0));
    WITH claimed AS (
        INSERT INTO {{table}} (consumer, topic, event_id)
        SELECT $1, $2, $3
        WHERE NOT EXISTS (SELECT 1 FROM {{table}} WHERE consumer = $1 AND topic = '' AND event_id = $3)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) = 1 FROM claimed
{{tag}};
COMMENT ON FUNCTION {{claim}}(text, text, text) IS 'walrelay inbox claim, 0003';

-- Claims an event for a consumer whatever its topic, as the first layout
-- did: true if it is new, false if the consumer handled that id under any
-- topic (each of the consumer's topics is looked up in the key's index,
-- one probe per topic). A concurrent claim of the same id, of either
-- form, waits for the first transaction and returns false once it
-- commits. Its row has topic ''.
CREATE OR REPLACE FUNCTION {{claim}}(consumer text, event_id text) RETURNS boolean
LANGUAGE sql AS {{tag}}
    SELECT pg_advisory_xact_lock(hashtextextended({{table_literal}} || '/' || $1 || '/' || $2, 0));
    WITH RECURSIVE topics(topic) AS (
        SELECT min(t.topic) FROM {{table}} t WHERE t.consumer = $1
        UNION ALL
        SELECT (SELECT min(t.topic) FROM {{table}} t WHERE t.consumer = $1 AND t.topic > topics.topic)
          FROM topics WHERE topics.topic IS NOT NULL
    ), claimed AS (
        INSERT INTO {{table}} (consumer, topic, event_id)
        SELECT $1, '', $2
        WHERE NOT EXISTS (SELECT 1 FROM topics WHERE topics.topic IS NOT NULL AND EXISTS (
            SELECT 1 FROM {{table}} i WHERE i.consumer = $1 AND i.topic = topics.topic AND i.event_id = $2))
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) = 1 FROM claimed
{{tag}};
