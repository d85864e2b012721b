-- The outbox table in the layout of Debezium's outbox event router, so a
-- team can switch connectors without touching its schema. The placeholders
-- (double braces) are the configured postgres.table and column names, quoted;
-- the one after the payload adds a text column per outbox.header_columns.
CREATE TABLE IF NOT EXISTS {{table}} (
    {{id}}            uuid         PRIMARY KEY,
    {{aggregatetype}} varchar(255) NOT NULL,
    {{aggregateid}}   varchar(255) NOT NULL,
    {{type}}          varchar(255) NOT NULL,
    {{payload}}       jsonb{{header_columns}}
);
