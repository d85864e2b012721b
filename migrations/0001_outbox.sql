-- The outbox table in the layout of Debezium's outbox event router, so a
-- team can switch connectors without touching its schema. {{table}} is the
-- configured postgres.table and each column name the configured one, quoted;
-- {{header_columns}} adds a text column per outbox.header_columns.
CREATE TABLE IF NOT EXISTS {{table}} (
    {{id}}            uuid         PRIMARY KEY,
    {{aggregatetype}} varchar(255) NOT NULL,
    {{aggregateid}}   varchar(255) NOT NULL,
    {{type}}          varchar(255) NOT NULL,
    {{payload}}       jsonb{{header_columns}}
);
