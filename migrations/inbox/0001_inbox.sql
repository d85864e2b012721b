-- The inbox of package inbox (walrelay migrate --inbox): one row per event
-- a consumer handled, written in the transaction of the handler's own
-- changes, so an event redelivered by Kafka (or sent twice by a relay after
-- a crash) is recognised by its id and skipped. The placeholders (double
-- braces) are the configured table, its schema and the claim function's
-- name, quoted.
CREATE TABLE IF NOT EXISTS {{table}} (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Prune deletes a consumer's oldest rows in batches.
CREATE INDEX IF NOT EXISTS {{index}} ON {{table}} (consumer, processed_at);

-- Claims an event for a consumer inside the caller's transaction: true if
-- it is new (the caller handles it, then commits), false if the consumer
-- already handled it (skip it). A concurrent claim of the same event waits
-- for the first transaction and returns false once it commits. Services in
-- any language call it; package inbox does too.
CREATE OR REPLACE FUNCTION {{claim}}(consumer text, event_id text) RETURNS boolean
LANGUAGE sql AS {{tag}}
    WITH claimed AS (
        INSERT INTO {{table}} (consumer, event_id) VALUES ($1, $2)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) = 1 FROM claimed
{{tag}};
