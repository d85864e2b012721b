-- The claims run in READ COMMITTED only. Each takes its advisory lock (see
-- 0003_inbox_claims_serialize.sql) and then looks in a statement of its
-- own, whose snapshot sees what the claim it waited for committed: in
-- READ COMMITTED. In REPEATABLE READ or SERIALIZABLE the transaction's
-- snapshot is taken at its first statement, before the wait, and the
-- claim would not see the other's row: the event would be handled twice.
-- A pool, role or database whose default_transaction_isolation is
-- stricter (set for the application's sake) does that silently; so both
-- claims raise an error instead, naming the fix. Package inbox begins its
-- transactions READ COMMITTED explicitly. The bodies are 0003's, in
-- PL/pgSQL (a SQL function cannot raise), whose statements each take a
-- snapshot of their own in READ COMMITTED as a SQL function's do.

CREATE OR REPLACE FUNCTION {{claim}}(consumer text, topic text, event_id text) RETURNS boolean
LANGUAGE plpgsql AS {{tag}}
#variable_conflict use_column
DECLARE
    fresh boolean;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'walrelay inbox claim: the transaction is %, not read committed: its snapshot would not see a claim of the same event it waits for, which would be handled twice', current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'begin the transaction ISOLATION LEVEL READ COMMITTED (BEGIN ISOLATION LEVEL READ COMMITTED), whatever default_transaction_isolation says';
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended({{table_literal}} || '/' || $1 || '/' || $3, 0));
    WITH claimed AS (
        INSERT INTO {{table}} (consumer, topic, event_id)
        SELECT $1, $2, $3
        WHERE NOT EXISTS (SELECT 1 FROM {{table}} i WHERE i.consumer = $1 AND i.topic = '' AND i.event_id = $3)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) = 1 INTO fresh FROM claimed;
    RETURN fresh;
END
{{tag}};
COMMENT ON FUNCTION {{claim}}(text, text, text) IS 'walrelay inbox claim, 0004';

CREATE OR REPLACE FUNCTION {{claim}}(consumer text, event_id text) RETURNS boolean
LANGUAGE plpgsql AS {{tag}}
#variable_conflict use_column
DECLARE
    fresh boolean;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'walrelay inbox claim: the transaction is %, not read committed: its snapshot would not see a claim of the same event it waits for, which would be handled twice', current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'begin the transaction ISOLATION LEVEL READ COMMITTED (BEGIN ISOLATION LEVEL READ COMMITTED), whatever default_transaction_isolation says';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended({{table_literal}} || '/' || $1 || '/' || $2, 0));
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
    SELECT count(*) = 1 INTO fresh FROM claimed;
    RETURN fresh;
END
{{tag}};
COMMENT ON FUNCTION {{claim}}(text, text) IS 'walrelay inbox claim, 0004';
