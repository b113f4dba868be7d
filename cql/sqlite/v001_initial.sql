-- The embedded store: the same tables and keys as the Cassandra schema (v001).
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS layouts (
    from_bucket INTEGER PRIMARY KEY,
    shard_count INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS layout_marks (
    from_bucket INTEGER NOT NULL,
    mark INTEGER NOT NULL,
    PRIMARY KEY (from_bucket, mark)
);
CREATE TABLE IF NOT EXISTS jobs_by_bucket (
    bucket INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    fire_at INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload BLOB NOT NULL,
    payload_json INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    fired_at INTEGER,
    PRIMARY KEY (bucket, shard, fire_at, job_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    payload BLOB NOT NULL,
    payload_json INTEGER NOT NULL,
    due_at INTEGER NOT NULL,
    fire_at INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    fired_at INTEGER,
    last_error TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    shard INTEGER PRIMARY KEY,
    bucket INTEGER NOT NULL,
    cursor_fire_at INTEGER,
    cursor_job_id TEXT,
    owner TEXT,
    owner_epoch INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    part INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    error TEXT,
    died_at INTEGER NOT NULL,
    PRIMARY KEY (part, job_id)
);
CREATE TABLE IF NOT EXISTS schema_versions (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at INTEGER NOT NULL
);
