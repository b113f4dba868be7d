-- v011: fired-through marks (see cql/versions/v011_fired_through.cql): one row per
-- partition and batch of outcomes, at the key up to which every row read has its outcome;
-- a bucket row with no fired_at at or before such a key fired at that row's `at`.
CREATE TABLE IF NOT EXISTS fired_through (
    bucket INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    fire_at INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (bucket, shard, fire_at, job_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fired_through_expiry ON fired_through (expires_at);
