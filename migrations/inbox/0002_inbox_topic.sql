-- The inbox keys its rows on (consumer, topic, event_id): an outbox's ids
-- are unique per table (a bigint identity, say), not across the topics a
-- consumer reads, so id 1 on two topics is two events. A table of the
-- first layout (keyed on consumer and event_id) gets the topic column,
-- '' in its rows, and the new key; each step is skipped once done, so the
-- file runs again harmlessly. Its rows stay unique under the new key (the
-- old key is a part of it); building the key's index holds the table's
-- lock meanwhile (seconds per million rows).
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS topic text NOT NULL DEFAULT '';

DO {{tag}}
DECLARE
    pk   name;
    cols text[];
BEGIN
    SELECT c.conname, array_agg(a.attname::text ORDER BY k.n)
      INTO pk, cols
      FROM pg_constraint c
      CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
      JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
     WHERE c.conrelid = {{table_literal}}::regclass AND c.contype = 'p'
     GROUP BY c.conname;
    IF cols IS DISTINCT FROM ARRAY['consumer', 'topic', 'event_id'] THEN
        IF pk IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{table_literal}}, pk);
        END IF;
        EXECUTE format('ALTER TABLE %s ADD PRIMARY KEY (consumer, topic, event_id)', {{table_literal}});
    END IF;
END
{{tag}};

-- Claims an event of a topic for a consumer inside the caller's
-- transaction: true if it is new (the caller handles it, then commits),
-- false if the consumer already handled it (skip it), or handled it
-- before the migration above (a row with topic ''). A concurrent claim of
-- the same event waits for the first transaction and returns false once
-- it commits. Package inbox calls it. The two-argument function of
-- 0001_inbox.sql stays for services that call it: it claims under topic
-- '', ids unique across everything they read.
CREATE OR REPLACE FUNCTION {{claim}}(consumer text, topic text, event_id text) RETURNS boolean
LANGUAGE sql AS {{tag}}
    WITH claimed AS (
        INSERT INTO {{table}} (consumer, topic, event_id)
        SELECT $1, $2, $3
        WHERE NOT EXISTS (SELECT 1 FROM {{table}} WHERE consumer = $1 AND topic = '' AND event_id = $3)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) = 1 FROM claimed
{{tag}};
