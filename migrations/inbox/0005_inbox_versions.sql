-- The versions of package inbox's Config.VersionOrder: for each consumer,
-- topic and aggregate (a record's key), the last version of the
-- aggregate it handled (the walrelay.aggregate_version header). The inbox
-- reads and writes a row in the transaction of the handler's changes, so
-- the version moves exactly when the handler's changes commit. One row per
-- aggregate, kept: Prune does not delete them, since an aggregate whose
-- row is gone takes its next event as its first.
CREATE TABLE IF NOT EXISTS {{versions}} (
    consumer   text        NOT NULL,
    topic      text        NOT NULL,
    aggregate  bytea       NOT NULL,
    version    bigint      NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, aggregate)
);
