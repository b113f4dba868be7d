-- v005: the replays of dead letters (the same table as the Cassandra schema's v005;
-- expires_at stands for its TTL).
CREATE TABLE IF NOT EXISTS replays (
    job_id TEXT NOT NULL,
    replayed_at INTEGER NOT NULL,
    died_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    error TEXT,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, replayed_at)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS replays_expiry ON replays (expires_at);
