-- walrelay_emit writes an outbox event into the WAL without a table row: a
-- transactional logical decoding message with the configured prefix
-- (outbox.message_prefix), which walrelay publishes like an
-- outbox insert, once the transaction commits. walrelay run refuses to start
-- when the function emits under another prefix.
CREATE OR REPLACE FUNCTION {{schema}}.walrelay_emit(
    p_id uuid, p_aggregatetype text, p_aggregateid text, p_type text, p_payload jsonb)
RETURNS pg_lsn LANGUAGE sql AS $$
    SELECT pg_logical_emit_message(true, {{prefix}}, json_build_object(
        'id', p_id, 'aggregatetype', p_aggregatetype, 'aggregateid', p_aggregateid,
        'type', p_type, 'payload', p_payload)::text)
$$;
